/**
 * Fixing forward and looking back, against a real `toren serve` and `toren worker`
 * (SQLite, the scripted model): `retry` of a run failed by a broken tool once the tool is
 * fixed on disk, `fork` of a completed run, `verify` and `invalidations`, with the typed
 * errors of each. The scripted model's ledger and the desk agent's outbox count what was
 * actually paid for and sent.
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  TorenAPIError,
  TorenClient,
  isEventType,
  type Event,
  type Run,
} from "@toren-run/client";

import { Project, TOKEN, freePort, waitFor } from "./harness.js";

let project: Project;
let url: string;
let client: TorenClient;

before(async () => {
  project = new Project();
  const port = await freePort();
  url = `http://127.0.0.1:${port}`;
  project.worker();
  await project.serve(port);
  client = new TorenClient(url, { token: TOKEN });
});

after(async () => {
  await project?.close();
});

const UNKNOWN = "run_00000000000000000000ff";

async function log(runId: string): Promise<Event[]> {
  return (await client.events(runId, { limit: 1000 })).events;
}

/** Emails the desk agent's `send_email` tool actually sent. */
function outbox(): unknown[] {
  const path = join(project.dir, "outbox.jsonl");
  if (!existsSync(path)) return [];
  return readFileSync(path, "utf8")
    .split("\n")
    .filter((line) => line.trim())
    .map((line) => JSON.parse(line) as unknown);
}

function edit(file: string, from: string, to: string): void {
  const path = join(project.agents, "desk", file);
  const text = readFileSync(path, "utf8");
  assert.ok(text.includes(from), `${file} has ${JSON.stringify(from)}`);
  writeFileSync(path, text.replace(from, to));
}

function apiError(status: number, code: string, message?: RegExp) {
  return (error: unknown): boolean => {
    assert.ok(error instanceof TorenAPIError, String(error));
    assert.equal(error.status, status, error.message);
    assert.equal(error.code, code, error.message);
    if (message) assert.match(error.message, message);
    return true;
  };
}

describe("retry", () => {
  test("a run failed by a broken tool, retried after the tool is fixed on disk, completes paying nothing again", async () => {
    const run = await client.startRun("desk", "the desk");
    const failed = await client.wait(run.id);
    assert.equal(failed.status, "failed");
    assert.equal(failed.retries, 0);
    const error = failed.error as { message: string; traceback?: string };
    assert.match(error.message, /QUEUE/);
    assert.match(error.traceback ?? "", /in file_report/);
    assert.equal(project.served(), 1, "one model call paid");
    assert.equal(outbox().length, 1, "one email sent");
    const end = (await log(run.id)).at(-1)!;
    assert.ok(isEventType(end, "RunFailed"));
    assert.equal(end.payload.failed_seqs?.length, 1);

    edit("tools.py", '"queue": QUEUE}', '"queue": "reports"}');
    const queued = await client.retry(run.id, { maxSteps: 50 });
    assert.equal(queued.id, run.id);
    assert.equal(queued.status, "queued");
    assert.equal(queued.retries, 1);
    assert.equal(queued.error ?? null, null);

    const done = await client.wait(run.id);
    assert.equal(done.status, "completed", JSON.stringify(done.error));
    assert.equal(done.retries, 1);
    assert.deepEqual(done.output, { answer: "reply 0", report: { filed: true, queue: "reports" } });
    assert.equal(project.served(), 1, "the recorded model call replayed, not paid again");
    assert.deepEqual(outbox(), [{ to: "c@example.com", body: "reply 0" }], "the email was not sent again");

    const events = await log(run.id);
    assert.deepEqual(
      events.slice(-3).map((e) => e.type),
      ["RunRetried", "ToolCallRecorded", "RunCompleted"],
    );
    const retried = events.find((e) => isEventType(e, "RunRetried"));
    assert.ok(retried && isEventType(retried, "RunRetried"));
    assert.equal(retried.payload.attempt, 1);
    assert.equal(retried.payload.failed_seq, end.seq);
    assert.deepEqual(retried.payload.retried_seqs, end.payload.failed_seqs);
    assert.deepEqual(retried.payload.raise_limits, { max_steps: 50 });
  });

  test("stream after retry follows the new attempt past the earlier RunFailed, to its end", async () => {
    const run = await client.startRun("demo", null, { process: "mend" });
    assert.equal((await client.wait(run.id)).status, "failed");
    writeFileSync(join(project.agents, "demo", "mended"), "");
    const retried = await client.retry(run.id);
    assert.notEqual(retried.status, "failed");

    const types: string[] = [];
    let retriedSeen = false;
    const iterator = client.stream(run.id);
    let step = await iterator.next();
    while (!step.done) {
      types.push(step.value.type);
      retriedSeen ||= step.value.type === "RunRetried";
      // The new attempt waits: answer it while streaming (an old RunWaiting is not it).
      if (retriedSeen && step.value.type === "RunWaiting") {
        await client.sendMessage(run.id, "approval", "yes");
      }
      step = await iterator.next();
    }
    assert.equal(step.value?.status, "completed", "the stream ends with the current attempt");
    assert.deepEqual(step.value?.output, { decision: "yes" });
    assert.ok(types.indexOf("RunFailed") < types.indexOf("RunRetried"));
    assert.equal(types.at(-1), "RunCompleted");
  });

  test("retry of a completed run: the typed 409 run_not_retryable; of an unknown run: 404", async () => {
    const run = await client.startRun("demo", null, { process: "quick" });
    assert.equal((await client.wait(run.id)).status, "completed");
    await assert.rejects(client.retry(run.id), apiError(409, "run_not_retryable", /completed.*fork it/));
    await assert.rejects(client.retry(UNKNOWN), apiError(404, "run_not_found", /run_0+ff/));
    await assert.rejects(
      client.retry(run.id, { maxSteps: 0 }),
      (error: unknown) => error instanceof TorenAPIError && error.status === 422,
    );
    assert.equal((await client.getRun(run.id)).retries, 0);
  });
});

describe("fork", () => {
  test("a fork of a completed run at main:1 replays step 0, runs the rest live and completes; the source is unchanged", async () => {
    const source = await client.startRun("demo", { steps: 3 });
    assert.equal((await client.wait(source.id)).status, "completed");
    const sourceLog = await log(source.id);
    const paid = project.served();

    const forked = await client.fork(source.id, "main:1");
    assert.notEqual(forked.id, source.id);
    assert.equal(forked.status, "queued");
    assert.deepEqual(forked.forked_from, { run_id: source.id, at: "main:1" });
    assert.deepEqual(forked.input, { steps: 3 }, "the source's input when none is given");
    const done = await client.wait(forked.id);
    assert.equal(done.status, "completed", JSON.stringify(done.error));
    assert.deepEqual(done.forked_from, { run_id: source.id, at: "main:1" });
    assert.equal((done.output as { steps: number }).steps, 3);
    assert.equal(project.served() - paid, 2, "steps 1 and 2 ran live; step 0 was not paid again");

    const events = await log(forked.id);
    assert.deepEqual(events.slice(0, 2).map((e) => e.type), ["RunStarted", "RunForked"]);
    const fork = events[1]!;
    assert.ok(isEventType(fork, "RunForked"));
    assert.equal(fork.payload.source_run, source.id);
    assert.equal(fork.payload.stream, "main");
    assert.equal(fork.payload.position, 1);
    assert.deepEqual(await log(source.id), sourceLog, "the source's log is untouched");
    assert.equal((await client.getRun(source.id)).status, "completed");
  });

  test("a fork with another input (null included) runs with it", async () => {
    const source = await client.startRun("demo", { steps: 3 });
    await client.wait(source.id);
    const paid = project.served();
    const shorter = await client.fork(source.id, "main:1", { input: { steps: 2 } });
    assert.deepEqual(shorter.input, { steps: 2 });
    const done = await client.wait(shorter.id);
    assert.equal(done.status, "completed", JSON.stringify(done.error));
    assert.equal((done.output as { steps: number }).steps, 2);
    assert.equal(project.served() - paid, 1);

    const nulled = await client.fork(source.id, "main:2", { input: null });
    assert.equal(nulled.input, null);
    assert.equal((await client.wait(nulled.id)).status, "completed");
  });

  test("a fork point the run does not have is 409 fork_point_not_found; an `at` of another shape 422 invalid_request", async () => {
    const source = await client.startRun("demo", { steps: 1 });
    await client.wait(source.id);
    await assert.rejects(client.fork(source.id, "main:99"), apiError(409, "fork_point_not_found"));
    await assert.rejects(client.fork(source.id, "main"), apiError(422, "invalid_request", /STREAM:POSITION/));
    await assert.rejects(client.fork(UNKNOWN, "main:0"), apiError(404, "run_not_found"));
  });
});

describe("verify and invalidations", () => {
  test("verify of a completed run: every step re-derived and verified", async () => {
    const run = await client.startRun("demo", { steps: 2 });
    await client.wait(run.id);
    const report = await client.verify(run.id);
    assert.equal(report.run_id, run.id);
    assert.equal(report.ok, true);
    assert.equal(report.steps, 2);
    assert.equal(report.verified, 2);
    assert.equal(report.mismatch, 0);
    assert.equal(report.unverifiable, 0);
    const steps = (await log(run.id)).filter((e) => isEventType(e, "ModelCallRecorded"));
    assert.deepEqual(
      report.checks.map((c) => [c.seq, c.stream, c.position, c.verdict, c.recorded_digest]),
      steps.map((e) => [e.seq, "main", e.position, "verified", e.digest]),
    );
    assert.ok(report.checks.every((c) => c.derived_digest === c.recorded_digest));
    await assert.rejects(client.verify(UNKNOWN), apiError(404, "run_not_found"));
  });

  test("invalidations: none for a clean run; the edited system prompt for a run resumed under new code", async () => {
    const clean = await client.startRun("demo", { steps: 1 });
    await client.wait(clean.id);
    assert.deepEqual(await client.invalidations(clean.id), []);

    const run = await client.startRun("desk", "the question", { process: "revise" });
    await waitFor(async () => (await client.getRun(run.id)).status === "waiting", `run ${run.id} to wait`);
    edit("prompt.txt", "Answer briefly.", "Answer in great detail.");
    await client.sendMessage(run.id, "go");
    const done = await client.wait(run.id);
    assert.equal(done.status, "completed", JSON.stringify(done.error));
    assert.equal(done.invalidations, 1);

    const found = await client.invalidations(run.id);
    assert.equal(found.length, 1, JSON.stringify(found));
    const [invalidation] = found;
    const event = (await log(run.id)).find((e) => e.type === "StreamInvalidated");
    assert.equal(invalidation!.seq, event?.seq);
    assert.equal(invalidation!.stream, "revise", "a process's root stream is named after it");
    assert.equal(invalidation!.from_pos, 0);
    assert.equal(invalidation!.cause, "digest_mismatch");
    const message = invalidation!.changes.find((c) => c.part === "message");
    assert.ok(message, JSON.stringify(invalidation!.changes));
    assert.equal(message.index, 0);
    assert.match(message.text, /message 0 \(the system prompt\) changed/);
    await assert.rejects(client.invalidations(UNKNOWN), apiError(404, "run_not_found"));
  });
});

describe("auth and AbortSignal", () => {
  test("a wrong token: 401 unauthorized from retry, fork, verify and invalidations", async () => {
    const wrong = new TorenClient(url, { token: "tok-wrong-0123456789abcdef" });
    for (const call of [
      () => wrong.retry(UNKNOWN),
      () => wrong.fork(UNKNOWN, "main:0"),
      () => wrong.verify(UNKNOWN),
      () => wrong.invalidations(UNKNOWN),
    ]) {
      await assert.rejects(call(), apiError(401, "unauthorized"));
    }
  });

  test("an aborted signal rejects each with its reason, and nothing is retried or forked", async () => {
    const run: Run = await client.startRun("demo", null, { process: "quick" });
    await client.wait(run.id);
    const reason = new Error("the page was closed");
    const signal = AbortSignal.abort(reason);
    for (const call of [
      () => client.retry(run.id, { signal }),
      () => client.fork(run.id, "quick:0", { signal }),
      () => client.verify(run.id, { signal }),
      () => client.invalidations(run.id, { signal }),
    ]) {
      await assert.rejects(call(), (error: unknown) => error === reason);
    }
    const forks = (await client.listRuns({ agent: "demo", process: "quick", limit: 200 })).runs.filter(
      (r) => r.forked_from?.run_id === run.id,
    );
    assert.deepEqual(forks, []);
  });
});
