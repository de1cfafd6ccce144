/**
 * Start a run and print its model's tokens as they are generated, then its outcome.
 *
 *     toren init hello && toren dev hello        # in another terminal
 *     node stream-tokens.js hello "What is the weather in Paris?"
 *     node stream-tokens.js support --process triage --input '{"question": "Where is A-17?"}'
 *
 * TOREN_API_URL (default http://127.0.0.1:8000) and TOREN_API_TOKEN say where the API is.
 * Ctrl-C stops following the run (the run itself goes on in the server's workers).
 */

import { parseArgs } from "node:util";

import { TorenClient, isEventType } from "@toren-run/client";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { process: { type: "string", default: "main" }, input: { type: "string" } },
});
const [agent, message] = positionals;
if (!agent) {
  console.error("usage: stream-tokens AGENT [MESSAGE] [--process P] [--input JSON]");
  process.exit(2);
}
const input: unknown = values.input !== undefined ? JSON.parse(values.input) : (message ?? null);

const client = new TorenClient(process.env["TOREN_API_URL"] ?? "http://127.0.0.1:8000", {
  token: process.env["TOREN_API_TOKEN"],
});
const stop = new AbortController();
process.once("SIGINT", () => stop.abort());

const run = await client.startRun(agent, input, { process: values.process });
console.log(`run ${run.id}`);
const shown = new Map<string, string>(); // what was printed of each model step's answer
for await (const item of client.stream(run.id, { deltas: true, signal: stop.signal })) {
  if (item.kind === "delta") {
    process.stdout.write(item.text);
    const step = `${item.stream}/${item.position}`;
    shown.set(step, (shown.get(step) ?? "") + item.text);
  } else if (isEventType(item, "ModelCallRecorded")) {
    // Deltas are best effort (they are not replayed after a reconnect, and a stream opened
    // while a call runs misses its first tokens): the recorded event has the whole answer,
    // and whatever of it was not printed yet is printed now.
    const text = item.payload.response?.text ?? "";
    const printed = shown.get(`${item.stream}/${item.position}`) ?? "";
    if (printed !== text) {
      process.stdout.write(text.startsWith(printed) ? text.slice(printed.length) : `\n${text}`);
    }
    process.stdout.write("\n");
  } else if (isEventType(item, "ToolCallRecorded")) {
    console.log(`[tool ${item.payload.name}]`);
  } else if (isEventType(item, "RunWaiting")) {
    console.log(`[waiting for ${item.payload.messages?.join(", ") ?? "a timer"}]`);
  }
}
const done = await client.getRun(run.id);
console.log(`${done.status}: ${JSON.stringify(done.output ?? done.error)}`);
process.exitCode = done.status === "completed" ? 0 : 1;
