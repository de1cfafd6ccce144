/**
 * The TypeScript example of docs/http-api.md ("Clients"), kept here so the type-check
 * covers it (a test checks that every TypeScript block of the docs is in an example file).
 */

import { TorenAPIError, TorenClient, isEventType } from "@toren-run/client";

const client = new TorenClient("http://127.0.0.1:8000", { token: "s3cret-0123456789abcdef" }); // or { apiKey }
const run = await client.startRun("support-agent", { message: "Where is my order A-17?" }, {
  idempotencyKey: "order-17",
});
for await (const item of client.stream(run.id, { deltas: true })) {   // resumes by itself
  if (item.kind === "delta") process.stdout.write(item.text);         // tokens, while a call runs
  else if (isEventType(item, "ModelCallRecorded")) console.log(item.seq, item.payload.response?.text);
}
const done = await client.wait(run.id, { timeout: 300_000 });
console.log(done.status, done.output, done.usage.cost_usd);

for await (const waiting of client.iterRuns({ status: "waiting" })) {  // every page, newest first
  await client.sendMessage(waiting.id, "approval", { approved: true });
}
try {
  await client.getRun("run_0190c2a5e1f3a1b2c3d4e5");
} catch (error) {
  if (error instanceof TorenAPIError && error.code === "run_not_found") console.log("no such run");
}
try {
  await client.retry(done.id, { maxSteps: 40 });                  // a failed run, once its code is fixed
} catch (error) {
  if (error instanceof TorenAPIError && error.code === "run_not_retryable") {
    const forked = await client.fork(done.id, "main:2");           // a completed one: fork it
    console.log(forked.forked_from);                               // { run_id, at: "main:2" }
  }
}
const report = await client.verify(done.id);                      // every digest re-derived
console.log(report.ok, await client.invalidations(done.id));      // what changed, per invalidation
