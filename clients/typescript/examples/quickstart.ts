/**
 * The README's first example, type-checked and run by the tests (test/dev.test.ts; a test
 * keeps the README's copy equal). Start the API with `toren dev examples/support-agent`.
 */

// README:start
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
// README:end
