/**
 * Every method of the client against a real `toren serve` and `toren worker` (SQLite, the
 * scripted model), with bearer-token and X-API-Key auth.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  TorenAPIError,
  TorenClient,
  TorenTimeoutError,
  isEventType,
  isTerminal,
  type Event,
  type Run,
  type StreamEvent,
} from "@toren-run/client";

import { Project, TOKEN, TorenProcess, freePort, waitFor } from "./harness.js";

let project: Project;
let url: string;
let client: TorenClient;
let worker: TorenProcess;

before(async () => {
  project = new Project();
  const port = await freePort();
  url = `http://127.0.0.1:${port}`;
  worker = project.worker();
  await project.serve(port);
  client = new TorenClient(url, { token: TOKEN });
});

after(async () => {
  await project?.close();
});

async function waitingRun(process: string, input: unknown = null): Promise<Run> {
  const run = await client.startRun("demo", input, { process });
  return waitFor(async () => {
    const now = await client.getRun(run.id);
    return now.status === "waiting" ? now : null;
  }, `run ${run.id} to wait`);
}

describe("runs", () => {
  test("startRun, getRun and wait: a run of the worker, start to end", async () => {
    const run = await client.startRun("demo", { steps: 2 });
    assert.match(run.id, /^run_[0-9a-f]{22}$/);
    assert.equal(run.agent, "demo");
    assert.equal(run.process, "main");
    assert.deepEqual(run.input, { steps: 2 });
    assert.ok(["queued", "running"].includes(run.status), run.status);

    const done = await client.wait(run.id, { timeout: 60_000 });
    assert.equal(done.status, "completed", JSON.stringify(done.error));
    assert.deepEqual(done.output, { answer: "a slow step is done, one token at a time", steps: 2 });
    assert.equal(done.usage.steps, 2);
    assert.equal(typeof done.usage.cost_usd, "string");
    assert.ok(isTerminal(done));
    assert.deepEqual(await client.getRun(run.id), done);
    assert.ok(worker.running);
  });

  test("startRun with an idempotency key returns the same run; other arguments are a 409", async () => {
    const key = `order-${Date.now()}`;
    const first = await client.startRun("demo", { n: 1 }, { process: "quick", idempotencyKey: key });
    const again = await client.startRun("demo", { n: 1 }, { process: "quick", idempotencyKey: key });
    assert.equal(again.id, first.id);
    assert.equal(again.idempotency_key, key);
    await assert.rejects(
      client.startRun("demo", { n: 2 }, { process: "quick", idempotencyKey: key }),
      (error: unknown) => {
        assert.ok(error instanceof TorenAPIError);
        assert.equal(error.status, 409);
        assert.equal(error.code, "idempotency_conflict");
        return true;
      },
    );
  });

  test("startRun of an unknown agent or process: 404 agent_not_found naming the known ones", async () => {
    await assert.rejects(client.startRun("nobody"), (error: unknown) => {
      assert.ok(error instanceof TorenAPIError);
      assert.equal(error.status, 404);
      assert.equal(error.code, "agent_not_found");
      assert.match(error.message, /demo/);
      return true;
    });
    await assert.rejects(client.startRun("demo", null, { process: "nope" }), { code: "agent_not_found" });
  });

  test("getRun of an unknown run: 404 run_not_found", async () => {
    await assert.rejects(client.getRun("run_00000000000000000000ff"), (error: unknown) => {
      assert.ok(error instanceof TorenAPIError);
      assert.equal(error.status, 404);
      assert.equal(error.code, "run_not_found");
      assert.match(error.message, /run_00000000000000000000ff/);
      return true;
    });
  });

  test("listRuns filters by status, agent and process; iterRuns walks every page", async () => {
    const started: string[] = [];
    for (let i = 0; i < 5; i++) {
      started.push((await client.startRun("demo", { i }, { process: "quick" })).id);
    }
    for (const id of started) await client.wait(id);

    const page = await client.listRuns({ agent: "demo", process: "quick", limit: 2 });
    assert.equal(page.runs.length, 2);
    assert.ok(page.next_cursor);
    const next = await client.listRuns({ agent: "demo", process: "quick", limit: 2, cursor: page.next_cursor });
    assert.ok(next.runs.every((r) => r.id < page.runs[1]!.id), "the next page holds older runs");

    const all: Run[] = [];
    for await (const run of client.iterRuns({ agent: "demo", process: "quick", limit: 2 })) all.push(run);
    const ids = all.map((r) => r.id);
    assert.equal(new Set(ids).size, ids.length, "no run twice");
    assert.deepEqual([...ids].sort().reverse(), ids, "newest first");
    for (const id of started) assert.ok(ids.includes(id), `${id} listed`);
    assert.ok(all.every((r) => r.process === "quick" && r.agent === "demo"));

    const completed = await client.listRuns({ status: "completed", limit: 200 });
    assert.ok(completed.runs.length >= 5);
    assert.ok(completed.runs.every((r) => r.status === "completed"));
    const waiting = await client.listRuns({ status: "waiting", process: "quick" });
    assert.deepEqual(waiting.runs, []);
    assert.equal(waiting.next_cursor, null);
  });

  test("listRuns with a bad cursor: 422 invalid_request naming query.cursor", async () => {
    await assert.rejects(client.listRuns({ cursor: "not-a-cursor" }), (error: unknown) => {
      assert.ok(error instanceof TorenAPIError);
      assert.equal(error.status, 422);
      assert.equal(error.code, "invalid_request");
      assert.match(error.message, /cursor/);
      return true;
    });
  });
});

describe("events and streams", () => {
  test("events pages through the log; iterEvents reads it whole", async () => {
    const run = await client.startRun("demo", { steps: 3 });
    await client.wait(run.id);
    const whole = await client.events(run.id, { limit: 1000 });
    assert.equal(whole.next_after, null);
    const types = whole.events.map((e) => e.type);
    assert.equal(types[0], "RunStarted");
    assert.equal(types.at(-1), "RunCompleted");
    assert.equal(types.filter((t) => t === "ModelCallRecorded").length, 3);

    const first = await client.events(run.id, { limit: 2 });
    assert.deepEqual(first.events, whole.events.slice(0, 2));
    assert.equal(first.next_after, whole.events[1]!.seq);
    const rest = await client.events(run.id, { after: first.next_after!, limit: 1000 });
    assert.deepEqual(rest.events, whole.events.slice(2));

    const walked: Event[] = [];
    for await (const event of client.iterEvents(run.id, { limit: 2 })) walked.push(event);
    assert.deepEqual(walked, whole.events);

    const started = whole.events[0]!;
    assert.ok(isEventType(started, "RunStarted"));
    assert.equal(started.payload.agent, "demo");
    const call = whole.events.find((e) => isEventType(e, "ModelCallRecorded"));
    assert.ok(call && isEventType(call, "ModelCallRecorded"));
    assert.equal(call.payload.response?.text, "a slow step is done, one token at a time");
    assert.equal(call.payload.provider, "scripted");
  });

  test("stream follows a live run to its end: every event once, in order, as in the log", async () => {
    const run = await client.startRun("demo", { steps: 3 });
    const seen: StreamEvent[] = [];
    const iterator = client.stream(run.id);
    let step = await iterator.next();
    while (!step.done) {
      seen.push(step.value);
      step = await iterator.next();
    }
    assert.equal(step.value?.id, run.id, "the iterator returns the final run");
    assert.equal(step.value?.status, "completed");
    const log = await client.events(run.id, { limit: 1000 });
    assert.deepEqual(
      seen.map(({ kind, ...event }) => (assert.equal(kind, "event"), event)),
      log.events,
    );
    assert.equal(seen.at(-1)!.type, "RunCompleted");
  });

  test("stream after a seq goes on after it; a seq of no event of the run is event_id_unavailable", async () => {
    const run = await client.startRun("demo", { steps: 1 });
    await client.wait(run.id);
    const log = (await client.events(run.id)).events;
    const tail: number[] = [];
    for await (const event of client.stream(run.id, { after: log[1]!.seq })) tail.push(event.seq);
    assert.deepEqual(tail, log.slice(2).map((e) => e.seq));

    await assert.rejects(
      (async () => {
        for await (const _ of client.stream(run.id, { after: log.at(-1)!.seq + 1_000_000 })) {
          // nothing arrives before the error
        }
      })(),
      (error: unknown) => {
        assert.ok(error instanceof TorenAPIError);
        assert.equal(error.code, "event_id_unavailable");
        assert.equal(error.status, 200);
        return true;
      },
    );
  });

  test("stream of an unknown run: 404 run_not_found before any event", async () => {
    await assert.rejects(
      (async () => {
        for await (const _ of client.stream("run_00000000000000000000ff")) {
          assert.fail("no event expected");
        }
      })(),
      { name: "TorenAPIError", code: "run_not_found", status: 404 },
    );
  });
});

describe("messages, cancellation and plan", () => {
  test("sendMessage wakes a waiting run, which ends with the payload; a finished run is a 409", async () => {
    const run = await waitingRun("approval");
    assert.deepEqual(run.waiting_for, ["approval"]);
    const id = await client.sendMessage(run.id, "approval", { approved: true, by: "ada" });
    assert.equal(typeof id, "number");
    const done = await client.wait(run.id);
    assert.equal(done.status, "completed");
    assert.deepEqual(done.output, { decision: { approved: true, by: "ada" } });
    const received = (await client.events(run.id, { limit: 1000 })).events.find((e) =>
      isEventType(e, "MessageReceived"),
    );
    assert.ok(received && isEventType(received, "MessageReceived"));
    assert.equal(received.payload.name, "approval");

    await assert.rejects(client.sendMessage(run.id, "approval", {}), {
      code: "run_finished",
      status: 409,
    });
  });

  test("sendMessage under a name the run does not wait for: kept, with a warning naming the names it waits for", async () => {
    const run = await waitingRun("approval");
    const warnings: string[] = [];
    const id = await client.sendMessage(run.id, "aproval", "yes", {
      onWarning: (warning) => warnings.push(warning),
    });
    assert.equal(typeof id, "number");
    assert.equal(warnings.length, 1);
    assert.match(warnings[0]!, /waiting for 'approval', not 'aproval'/);
    assert.equal((await client.getRun(run.id)).status, "waiting", "not woken");
    await client.sendMessage(run.id, "approval", "yes", { onWarning: (w) => warnings.push(w) });
    assert.equal((await client.wait(run.id)).status, "completed");
    assert.equal(warnings.length, 1, "no warning for the name it waits for");
  });

  test("cancel ends a waiting run as cancelled; its stream ends on RunCancelled", async () => {
    const run = await waitingRun("approval");
    const requested = await client.cancel(run.id);
    assert.equal(requested.id, run.id);
    assert.equal(requested.cancel_requested, true);
    const types: string[] = [];
    for await (const event of client.stream(run.id)) types.push(event.type);
    assert.equal(types.at(-1), "RunCancelled");
    assert.equal((await client.getRun(run.id)).status, "cancelled");
    const again = await client.cancel(run.id);
    assert.equal(again.status, "cancelled");
  });

  test("plan reports the in-flight runs replayed against the served code", async () => {
    const run = await waitingRun("approval");
    const report = await client.plan();
    assert.equal(typeof report.elapsed_ms, "number");
    const mine = report.plans.find((p) => p.run_id === run.id);
    assert.ok(mine, "the waiting run is planned");
    assert.equal(mine.clean, true);
    assert.equal(mine.problem, null);
    assert.deepEqual(mine.findings, []);
    assert.ok(mine.replayed_steps >= 1);
    const limited = await client.plan({ limit: 1 });
    assert.ok(limited.plans.length <= 1);
    await client.cancel(run.id);
  });
});

describe("operations and auth", () => {
  test("health needs no token and reports the server's version", async () => {
    const anonymous = new TorenClient(url);
    const health = await anonymous.health();
    assert.deepEqual(health, { status: "ok", version: "0.1.0" });
    assert.deepEqual(await client.ready(), { status: "ready" });
  });

  test("agents lists the demo agent and its processes", async () => {
    const agents = await client.agents();
    const demo = agents.find((a) => a.name === "demo");
    assert.ok(demo);
    assert.deepEqual([...demo.processes].sort(), ["approval", "gated", "main", "mend", "quick"]);
    assert.equal(demo.error ?? null, null);
  });

  test("X-API-Key authenticates as the bearer token does", async () => {
    const keyed = new TorenClient(url, { apiKey: TOKEN });
    const page = await keyed.listRuns({ limit: 1 });
    assert.equal(page.runs.length, 1);
    const run = await keyed.startRun("demo", 7, { process: "quick" });
    assert.equal((await keyed.wait(run.id)).status, "completed");
  });

  test("a wrong or missing token: 401 unauthorized on every call, the token never echoed", async () => {
    const wrongToken = "tok-wrong-0123456789abcdef";
    for (const wrong of [
      new TorenClient(url, { token: wrongToken }),
      new TorenClient(url, { apiKey: wrongToken }),
      new TorenClient(url),
    ]) {
      const calls: (() => Promise<unknown>)[] = [
        () => wrong.listRuns(),
        () => wrong.startRun("demo"),
        () => wrong.getRun("run_00000000000000000000ff"),
        () => wrong.plan(),
        () => wrong.agents(),
        async () => {
          for await (const _ of wrong.stream("run_00000000000000000000ff")) assert.fail("no event");
        },
      ];
      for (const call of calls) {
        await assert.rejects(call(), (error: unknown) => {
          assert.ok(error instanceof TorenAPIError, String(error));
          assert.equal(error.status, 401);
          assert.equal(error.code, "unauthorized");
          assert.ok(!error.message.includes(wrongToken));
          return true;
        });
      }
    }
  });
});

describe("malformed request bodies", () => {
  test("an input nested too deep: 422 invalid_request with the server's message and details", async () => {
    let deep: unknown = 1;
    for (let i = 0; i < 70; i++) deep = { a: [deep] };
    await assert.rejects(client.startRun("demo", deep), (error: unknown) => {
      assert.ok(error instanceof TorenAPIError);
      assert.equal(error.status, 422);
      assert.equal(error.code, "invalid_request");
      assert.match(error.message, /nests objects and arrays \d+ levels deep.*expected at most 64 levels/);
      assert.ok(Array.isArray(error.details) && error.details.length >= 1, JSON.stringify(error.details));
      assert.match(String(error), /\(HTTP 422, invalid_request\)$/);
      return true;
    });
  });

  test("a bad agent name or message name: 422 invalid_request naming the field", async () => {
    await assert.rejects(client.startRun("no spaces allowed"), (error: unknown) => {
      assert.ok(error instanceof TorenAPIError);
      assert.equal(error.code, "invalid_request");
      const where = (error.details as { where: string }[]).map((d) => d.where);
      assert.ok(where.includes("body.agent"), JSON.stringify(error.details));
      return true;
    });
    const run = await waitingRun("approval");
    await assert.rejects(client.sendMessage(run.id, "bad\u0000name", {}), {
      code: "invalid_request",
      status: 422,
    });
    await client.cancel(run.id);
  });
});

describe("AbortSignal", () => {
  test("an aborted stream rejects with the signal's reason", async () => {
    const run = await waitingRun("approval");
    const controller = new AbortController();
    const types: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const event of client.stream(run.id, { signal: controller.signal })) {
          types.push(event.type);
          if (event.type === "RunWaiting") controller.abort();
        }
      })(),
      { name: "AbortError" },
    );
    assert.ok(types.includes("RunWaiting"));
    await client.cancel(run.id);
  });

  test("an aborted request, and wait(), reject with the reason; a timeout is TorenTimeoutError", async () => {
    await assert.rejects(client.getRun("run_x", { signal: AbortSignal.abort() }), { name: "AbortError" });
    const reason = new Error("the page was closed");
    const controller = new AbortController();
    const run = await waitingRun("approval");
    const waiting = client.wait(run.id, { signal: controller.signal });
    controller.abort(reason);
    await assert.rejects(waiting, (error: unknown) => error === reason);
    await assert.rejects(client.wait(run.id, { timeout: 200 }), (error: unknown) => {
      assert.ok(error instanceof TorenTimeoutError);
      assert.equal(error.status, "waiting");
      return true;
    });
    await client.cancel(run.id);
  });
});

describe("schedules", () => {
  test("create, list, fire, pause with a note, trigger, backfill and delete", async () => {
    const made = await client.createSchedule("demo", "beat", {
      every: "1s",
      input: { steps: 1 },
      overlap: "allow_all",
    });
    assert.equal(made.id, "demo/beat");
    assert.equal(made.source, "api");
    assert.equal(made.upcoming.length, 5);

    // The worker fires it: a run whose origin is the schedule.
    const fired = await waitFor(async () => {
      const found = await client.getSchedule("demo/beat");
      return found.recent_runs && found.recent_runs.length > 0 ? found.recent_runs[0] : null;
    }, "the schedule to fire");
    const run = await client.getRun(fired.id);
    assert.deepEqual(run.schedule, { id: "demo/beat", nominal: fired.nominal });

    const paused = await client.pauseSchedule("demo/beat", "quiet hours");
    assert.equal(paused.paused, true);
    assert.equal(paused.note, "quiet hours");
    assert.deepEqual(
      (await client.schedules()).map((s) => [s.id, s.paused]),
      [["demo/beat", true]],
    );
    const triggered = await client.triggerSchedule("demo/beat");
    assert.equal(triggered.agent, "demo");
    const range = ["2026-01-01T00:00:00+00:00", "2026-01-01T00:00:10+00:00"] as const;
    assert.deepEqual(await client.backfillSchedule("demo/beat", ...range), {
      started: 10,
      already_ran: 0,
      refused: 0,
    });
    assert.deepEqual(await client.backfillSchedule("demo/beat", ...range), {
      started: 0,
      already_ran: 10,
      refused: 0,
    });
    await client.deleteSchedule("demo/beat");
    await assert.rejects(client.getSchedule("demo/beat"), (error: unknown) => {
      assert.ok(error instanceof TorenAPIError);
      assert.equal(error.status, 404);
      assert.equal(error.code, "schedule_not_found");
      return true;
    });
    await assert.rejects(
      client.createSchedule("demo", "bad", { cron: "0 25 * * *" }),
      (error: unknown) => {
        assert.ok(error instanceof TorenAPIError);
        assert.equal(error.status, 422);
        assert.match(error.message, /not a valid cron expression/);
        return true;
      },
    );
  });
});
