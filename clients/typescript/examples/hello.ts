/**
 * The repository README's TypeScript example ("From TypeScript"), kept here so the
 * type-check covers it. Start the API with `toren init hello && toren dev hello`.
 */

import { TorenClient } from "@toren-run/client";

const client = new TorenClient("http://127.0.0.1:8000", { token: process.env.TOREN_API_TOKEN });
const run = await client.startRun("hello", "What is the weather in Paris?");
for await (const item of client.stream(run.id, { deltas: true })) {
  if (item.kind === "delta") process.stdout.write(item.text);   // the model's tokens, live
  else if (item.type === "RunWaiting") await client.sendMessage(run.id, "human", "Yes");
}
console.log((await client.getRun(run.id)).output);
