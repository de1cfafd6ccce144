/**
 * The package README's example, run by the tests against `toren dev` with the repository's
 * examples/support-agent (test/dev.test.ts). A test checks that every TypeScript block of
 * the docs is in one of these example files, so the type-check covers them.
 */

import { TorenClient } from "@toren-run/client";

const client = new TorenClient(process.env.TOREN_API_URL ?? "http://127.0.0.1:8000", {
  token: process.env.TOREN_API_TOKEN,
});
const run = await client.startRun("support-agent", { message: "Where is order A-17?" }, {
  idempotencyKey: "order-17",
});
for await (const item of client.stream(run.id, { deltas: true })) {
  if (item.kind === "delta") process.stdout.write(item.text); // the model's tokens, live
  else if (item.type === "RunWaiting") await client.sendMessage(run.id, "human", "Yes, go ahead");
  else console.log(`\n${item.seq} ${item.type}`);
}
const done = await client.getRun(run.id);
console.log(done.status, done.output, done.usage.cost_usd);
