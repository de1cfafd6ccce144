/**
 * Token deltas and the example script against `toren dev` (worker and API in one process,
 * so the API forwards the model's tokens while a call is in flight; no token on loopback).
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { cpSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { TorenClient, isEventType, type Delta, type StreamEvent } from "@toren-run/client";

import { PACKAGE, Project, REPO, freePort } from "./harness.js";

const ANSWER = "Streaming tokens from a durable run, chunk by chunk.";
let project: Project;
let url: string;

before(async () => {
  project = new Project();
  // The repository's example agent too, for the README's quickstart.
  cpSync(join(REPO, "examples", "support-agent"), join(project.agents, "support-agent"), { recursive: true });
  const port = await freePort();
  url = `http://127.0.0.1:${port}`;
  await project.dev(port);
});

after(async () => {
  await project?.close();
});

test("stream with deltas yields the model's tokens before the recorded call, then its events", async () => {
  const client = new TorenClient(url);
  // `gated` waits for "go" before its model call: the stream is open (it delivered
  // RunWaiting) when the tokens are generated, so every delta reaches it.
  const run = await client.startRun("demo", null, { process: "gated" });
  const events: StreamEvent[] = [];
  const deltas: Delta[] = [];
  let deltasBeforeRecorded = -1;
  for await (const item of client.stream(run.id, { deltas: true })) {
    if (item.kind === "delta") {
      deltas.push(item);
      continue;
    }
    events.push(item);
    if (isEventType(item, "RunWaiting")) await client.sendMessage(run.id, "go", true);
    if (isEventType(item, "ModelCallRecorded")) deltasBeforeRecorded = deltas.length;
  }
  const call = events.find((e) => isEventType(e, "ModelCallRecorded"));
  assert.ok(call && isEventType(call, "ModelCallRecorded"));
  assert.ok(deltas.length > 1, `the answer came in several deltas: ${JSON.stringify(deltas)}`);
  assert.equal(deltasBeforeRecorded, deltas.length, "every delta arrived before the recorded call");
  assert.equal(deltas.map((d) => d.text).join(""), ANSWER);
  assert.equal(call.payload.response?.text, ANSWER);
  for (const delta of deltas) {
    assert.equal(delta.stream, call.stream);
    assert.equal(delta.position, call.position);
  }
  const log = (await client.events(run.id, { limit: 1000 })).events;
  assert.deepEqual(
    events.map(({ kind: _, ...event }) => event),
    log,
  );

  // Without deltas: the same events and no delta.
  const again: StreamEvent[] = [];
  for await (const event of client.stream(run.id)) again.push(event);
  assert.deepEqual(again, events);
});

/** Runs a compiled example; `onLine` sees each line of its output as it comes. */
async function runExample(
  name: string,
  args: string[],
  onLine: (line: string) => Promise<void> | void = () => undefined,
): Promise<string> {
  const script = join(PACKAGE, ".build", "examples", `${name}.js`);
  const child = spawn(process.execPath, [script, ...args], {
    env: { ...process.env, TOREN_API_URL: url },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (chunk: Buffer) => {
    const before = stdout.split("\n").length - 1;
    stdout += chunk.toString();
    for (const line of stdout.split("\n").slice(before, -1)) void onLine(line);
  });
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const code = await new Promise<number | null>((ok) => child.once("exit", ok));
  assert.equal(code, 0, stdout + stderr);
  return stdout;
}

test("the example script streams a run's tokens and prints its outcome", async () => {
  // `gated` waits for "go": it is sent once the example printed that, so its stream is
  // open before the model's tokens are generated and it prints them as they come.
  const client = new TorenClient(url);
  let runId = "";
  const stdout = await runExample("stream-tokens", ["demo", "--process", "gated"], async (line) => {
    if (line.startsWith("run ")) runId = line.slice(4);
    if (line === "[waiting for go]") await client.sendMessage(runId, "go", true);
  });
  const lines = stdout.trimEnd().split("\n");
  assert.match(lines[0]!, /^run run_[0-9a-f]{22}$/);
  assert.deepEqual(lines.slice(1), ["[waiting for go]", ANSWER, `completed: ${JSON.stringify({ answer: ANSWER })}`]);
  assert.equal((await client.getRun(runId)).status, "completed");
});

test("the README's quickstart runs the support agent to its end", async () => {
  const stdout = await runExample("quickstart", []);
  assert.match(stdout, /\d+ RunStarted\n/);
  assert.match(stdout, /\d+ ToolCallRecorded\n[\s\S]*\d+ RunCompleted\n/);
  assert.match(stdout, /^completed \{\s+answer: 'Your order A-17 has shipped with DHL/m);
});
