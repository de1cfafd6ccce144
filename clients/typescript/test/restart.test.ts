/**
 * A stream survives its server: `toren serve` is stopped twice while a run goes on in a
 * separate `toren worker` (once with SIGTERM, which ends open streams without `end`, once
 * with SIGKILL, which drops the connection), and started again on the same port; the
 * worker records steps while no server runs. The
 * client resumes with Last-Event-ID each time; what it delivered is compared with the
 * run's log read afterwards: no event lost, none duplicated, in order.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { TorenClient, isEventType, type Event, type StreamEvent } from "@toren-run/client";

import { Project, TOKEN, freePort, waitFor } from "./harness.js";

let project: Project;

before(() => {
  project = new Project();
});

after(async () => {
  await project?.close();
});

test("a stream interrupted by server restarts mid-run resumes with no event lost or repeated", async () => {
  const [port, otherPort] = [await freePort(), await freePort()];
  project.worker();
  // A second server on the same database: the gates are opened through it while the
  // first one is down (as through another instance behind a load balancer).
  let [server] = await Promise.all([project.serve(port), project.serve(otherPort)]);
  const other = new TorenClient(`http://127.0.0.1:${otherPort}`, { token: TOKEN });
  // Server starts are slow on a busy machine: allow ~2 minutes of reconnection attempts.
  const client = new TorenClient(`http://127.0.0.1:${port}`, { token: TOKEN, maxReconnects: 60 });

  // Six steps; the run waits for "a" before step 2 and for "b" before step 4.
  const steps = 6;
  const gates: Record<string, NodeJS.Signals> = { a: "SIGTERM", b: "SIGKILL" };
  const run = await client.startRun("demo", { steps, gates: { "2": "a", "4": "b" } });
  const seen: StreamEvent[] = [];
  const restarts: { after: number; signal: NodeJS.Signals; servedWhileDown: number }[] = [];

  for await (const event of client.stream(run.id)) {
    seen.push(event);
    if (!isEventType(event, "RunWaiting")) continue;
    const [gate] = event.payload.messages ?? [];
    const signal = gates[gate ?? ""];
    assert.ok(signal, `the run waits for a gate: ${JSON.stringify(event.payload)}`);
    // Stop the server while the stream is open, open the gate through the other server,
    // let the worker record two more steps while no server runs, then start a new
    // server on the same port. The stream is resumed by the client alone.
    await server!.stop(signal);
    const served = project.served();
    await other.sendMessage(run.id, gate!, "open");
    await waitFor(() => project.served() >= served + 2, "two steps recorded while the server is down");
    restarts.push({ after: event.seq, signal, servedWhileDown: project.served() - served });
    server = await project.serve(port);
  }

  assert.deepEqual(
    restarts.map((r) => r.signal),
    ["SIGTERM", "SIGKILL"],
    "the server was stopped twice mid-run",
  );
  const log: Event[] = [];
  for await (const event of client.iterEvents(run.id)) log.push(event);
  const seqs = seen.map((e) => e.seq);
  assert.equal(new Set(seqs).size, seqs.length, "no event delivered twice");
  assert.deepEqual(seqs, log.map((e) => e.seq), "every event of the log, in order");
  assert.deepEqual(
    seen.map(({ kind: _, ...event }) => event),
    log,
  );
  for (const restart of restarts) {
    // Events written while the server was down reached the stream after the restart.
    const later = log.filter((e) => e.seq > restart.after && e.type === "ModelCallRecorded");
    assert.ok(later.length >= restart.servedWhileDown, JSON.stringify(restart));
  }
  assert.equal(seen.at(-1)!.type, "RunCompleted");
  const done = await client.getRun(run.id);
  assert.equal(done.status, "completed");
  assert.deepEqual(done.output, { answer: "a slow step is done, one token at a time", steps });
  assert.equal(project.served(), steps, "each model step was paid once");
});
