/**
 * What the client does when the other end is not a healthy Toren server: nothing listens
 * (TorenConnectionError), a proxy answers an HTML page (http_error), a 200 whose body is not
 * the API's JSON (invalid_response), a stream that sends garbage or keeps breaking. The
 * "servers" here are plain node:http servers on loopback that answer with those bytes.
 */

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { after, before, describe, test } from "node:test";

import { TorenAPIError, TorenClient, TorenConnectionError } from "@toren-run/client";

import { freePort } from "./harness.js";

type Handler = (request: IncomingMessage, response: ServerResponse) => void;

let server: Server;
let url: string;
let handler: Handler = (_, response) => response.end();
const requests: IncomingMessage[] = [];

before(async () => {
  server = createServer((request, response) => {
    requests.push(request);
    handler(request, response);
  });
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  const address = server.address();
  url = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`;
});

after(async () => {
  server.closeAllConnections();
  await new Promise((ok) => server.close(ok));
});

function answer(status: number, body: string, type = "application/json"): void {
  handler = (_, response) => {
    response.writeHead(status, { "Content-Type": type });
    response.end(body);
  };
}

describe("server down", () => {
  test("a request to a port nothing listens on: TorenConnectionError", async () => {
    const port = await freePort();
    const client = new TorenClient(`http://127.0.0.1:${port}`, { token: "tok-down-0123456789" });
    const id = "run_00000000000000000000ff";
    for (const call of [
      () => client.getRun(id),
      () => client.retry(id),
      () => client.fork(id, "main:0"),
      () => client.verify(id),
      () => client.invalidations(id),
    ]) {
      await assert.rejects(call(), (error: unknown) => {
        assert.ok(error instanceof TorenConnectionError);
        assert.ok(error instanceof TorenAPIError, "a TorenAPIError, as in the Python client");
        assert.equal(error.code, "connection_error");
        assert.equal(error.status, 0);
        assert.match(error.message, new RegExp(`cannot reach http://127\\.0\\.0\\.1:${port}`));
        return true;
      });
    }
  });

  test("a stream whose server stays down gives up after maxReconnects: TorenConnectionError", async () => {
    const port = await freePort();
    const client = new TorenClient(`http://127.0.0.1:${port}`, { maxReconnects: 2 });
    await assert.rejects(
      (async () => {
        for await (const _ of client.stream("run_00000000000000000000ff", { after: 5 })) {
          assert.fail("no event expected");
        }
      })(),
      (error: unknown) => {
        assert.ok(error instanceof TorenConnectionError);
        assert.match(error.message, /broke 3 times in a row \(last after event 5\)/);
        return true;
      },
    );
  });

  test("a server that never answers: TorenConnectionError after the timeout", async () => {
    handler = () => undefined; // never responds
    const client = new TorenClient(url, { timeout: 200 });
    await assert.rejects(client.health(), (error: unknown) => {
      assert.ok(error instanceof TorenConnectionError);
      assert.match(error.message, /no answer from .* within 0\.2s/);
      return true;
    });
    server.closeAllConnections();
  });
});

describe("malformed response bodies", () => {
  test("an error page that is not the API's JSON: http_error with the status and the page", async () => {
    answer(502, "<html><body>Bad Gateway</body></html>", "text/html");
    await assert.rejects(new TorenClient(url).getRun("run_1"), (error: unknown) => {
      assert.ok(error instanceof TorenAPIError);
      assert.equal(error.status, 502);
      assert.equal(error.code, "http_error");
      assert.match(error.message, /Bad Gateway/);
      return true;
    });
  });

  test("a 200 whose body is not JSON: invalid_response", async () => {
    answer(200, "<html>a login page</html>", "text/html");
    await assert.rejects(new TorenClient(url).listRuns(), (error: unknown) => {
      assert.ok(error instanceof TorenAPIError);
      assert.equal(error.status, 200);
      assert.equal(error.code, "invalid_response");
      assert.match(error.message, /GET \/v1\/runs answered HTTP 200 with a body that is not JSON/);
      return true;
    });
  });

  test("a 200 with JSON of another shape: invalid_response naming what is missing", async () => {
    answer(200, JSON.stringify({ items: [] }));
    await assert.rejects(new TorenClient(url).listRuns(), {
      code: "invalid_response",
      message: /JSON of another shape: the object has no 'runs'/,
    });
    answer(200, JSON.stringify([1, 2]));
    await assert.rejects(new TorenClient(url).getRun("run_1"), {
      code: "invalid_response",
      message: /expected a JSON object, got an array/,
    });
  });

  test("the API's error body keeps its code, message and details; secrets are scrubbed", async () => {
    const token = "tok-echoed-by-a-bad-proxy-0123";
    const fromEnv = "value-of-a-credential-variable-42";
    process.env["SOME_SERVICE_PASSWORD"] = fromEnv;
    answer(
      409,
      JSON.stringify({
        error: {
          code: "idempotency_conflict",
          message: `key reused (token ${token}, key sk-abcdefghijklmnopqrstuvwxyz, ${fromEnv})`,
          details: [{ where: "body", message: token }],
        },
      }),
    );
    const client = new TorenClient(url, { token });
    delete process.env["SOME_SERVICE_PASSWORD"];
    await assert.rejects(client.startRun("demo"), (error: unknown) => {
      assert.ok(error instanceof TorenAPIError);
      assert.equal(error.code, "idempotency_conflict");
      assert.equal(error.message, "key reused (token [redacted], key [redacted], [redacted])");
      assert.deepEqual(error.details, [{ where: "body", message: "[redacted]" }]);
      return true;
    });
    const sent = requests.at(-1)!;
    assert.equal(sent.headers["authorization"], `Bearer ${token}`);
    assert.equal(sent.headers["content-type"], "application/json");
  });

  test("retry, fork, verify, invalidations: the requests they send, and answers of another shape", async () => {
    const sent: { method: string; url: string; type: string | undefined; body: string }[] = [];
    let reply = "{}";
    handler = (request, response) => {
      let body = "";
      request.on("data", (chunk: Buffer) => (body += chunk.toString()));
      request.on("end", () => {
        const type = request.headers["content-type"];
        sent.push({ method: request.method!, url: request.url!, type, body });
        response.writeHead(200, { "Content-Type": "application/json" });
        response.end(reply);
      });
    };
    const client = new TorenClient(url);
    reply = JSON.stringify({ id: "run_1", status: "queued" });
    await client.retry("run/1");
    await client.retry("run_1", { maxSteps: 40, maxCostUsd: 2.5 });
    await client.fork("run_1", "main:2");
    await client.fork("run_1", "main:2", { input: null });
    await client.fork("run_1", "main:2", { input: { q: 1 } });
    reply = JSON.stringify({ run_id: "run_1", ok: true, checks: [] });
    assert.deepEqual(await client.verify("run_1"), { run_id: "run_1", ok: true, checks: [] });
    reply = JSON.stringify({ invalidations: [{ seq: 3 }] });
    assert.deepEqual(await client.invalidations("run_1"), [{ seq: 3 }]);
    assert.deepEqual(sent, [
      { method: "POST", url: "/v1/runs/run%2F1/retry", type: "application/json", body: "{}" },
      {
        method: "POST",
        url: "/v1/runs/run_1/retry",
        type: "application/json",
        body: '{"max_steps":40,"max_cost_usd":2.5}',
      },
      { method: "POST", url: "/v1/runs/run_1/fork", type: "application/json", body: '{"at":"main:2"}' },
      {
        method: "POST",
        url: "/v1/runs/run_1/fork",
        type: "application/json",
        body: '{"at":"main:2","input":null}',
      },
      {
        method: "POST",
        url: "/v1/runs/run_1/fork",
        type: "application/json",
        body: '{"at":"main:2","input":{"q":1}}',
      },
      { method: "GET", url: "/v1/runs/run_1/verify", type: undefined, body: "" },
      { method: "GET", url: "/v1/runs/run_1/invalidations", type: undefined, body: "" },
    ]);

    reply = JSON.stringify({ run_id: "run_1", ok: true });
    await assert.rejects(client.verify("run_1"), {
      code: "invalid_response",
      message: /\/verify answered HTTP 200 with JSON of another shape: the object has no 'checks'/,
    });
    reply = JSON.stringify({ invalidations: {} });
    await assert.rejects(client.invalidations("run_1"), {
      code: "invalid_response",
      message: /'invalidations' is not a list/,
    });
    reply = JSON.stringify({ queued: true });
    await assert.rejects(client.retry("run_1"), { code: "invalid_response", message: /no 'id'/ });
    await assert.rejects(client.fork("run_1", "main:0"), { code: "invalid_response", message: /no 'id'/ });
  });

  test("a stream message whose data is not JSON: invalid_response", async () => {
    answer(200, "retry: 1000\n\nid: 1\nevent: event\ndata: {not json\n\n", "text/event-stream");
    await assert.rejects(
      (async () => {
        for await (const _ of new TorenClient(url).stream("run_1")) assert.fail("no event expected");
      })(),
      { code: "invalid_response", message: /sent a 'event' message whose data is not a JSON object/ },
    );
  });
});

describe("stream protocol", () => {
  test("a 200 that is not an event stream (a login page): invalid_response at once", async () => {
    answer(200, "<html>please log in</html>", "text/html");
    await assert.rejects(
      (async () => {
        for await (const _ of new TorenClient(url).stream("run_1")) assert.fail("no event expected");
      })(),
      { code: "invalid_response", message: /Content-Type 'text\/html' instead of an event stream/ },
    );
  });

  test("a stream whose server never answers is retried, then TorenConnectionError", async () => {
    let calls = 0;
    handler = () => {
      calls += 1; // accepts the request, never answers
    };
    const client = new TorenClient(url, { streamTimeout: 150, maxReconnects: 1 });
    await assert.rejects(
      (async () => {
        for await (const _ of client.stream("run_1")) assert.fail("no event expected");
      })(),
      (error: unknown) => {
        assert.ok(error instanceof TorenConnectionError);
        assert.match(error.message, /broke 2 times in a row \(last after event 0\): no answer for 0\.15s/);
        return true;
      },
    );
    assert.equal(calls, 2);
    server.closeAllConnections();
  });

  test("resumes with Last-Event-ID after an early close, skips unknown messages, ends on end", async () => {
    const event = (seq: number, type: string) =>
      `id: ${seq}\nevent: event\ndata: ${JSON.stringify({ seq, run_id: "run_1", type, payload: {} })}\n\n`;
    const seenHeaders: (string | undefined)[] = [];
    let calls = 0;
    handler = (request, response) => {
      seenHeaders.push(request.headers["last-event-id"] as string | undefined);
      calls += 1;
      response.writeHead(200, { "Content-Type": "text/event-stream" });
      if (calls === 1) {
        // Two events, then the connection ends without `end` (a server stopping).
        response.end(`retry: 1000\n\n${event(3, "RunStarted")}: heartbeat\n\n${event(7, "X")}`);
      } else if (calls === 2) {
        response.destroy(); // a reset before anything is sent
      } else {
        response.end(
          `event: novelty\ndata: {"a":1}\n\n${event(7, "X")}${event(9, "RunCompleted")}` +
            `event: end\ndata: {"run":{"id":"run_1","status":"completed"}}\n\n${event(11, "After")}`,
        );
      }
    };
    const client = new TorenClient(url);
    const seqs: number[] = [];
    const iterator = client.stream("run_1");
    let step = await iterator.next();
    while (!step.done) {
      seqs.push(step.value.seq);
      step = await iterator.next();
    }
    assert.deepEqual(seqs, [3, 7, 9], "7 once, nothing after end");
    assert.deepEqual(step.value, { id: "run_1", status: "completed" });
    assert.deepEqual(seenHeaders, [undefined, "7", "7"]);
    assert.equal(new URL(requests.at(-1)!.url!, url).searchParams.get("after"), "7");
  });

  test("a silent connection is dropped after streamTimeout and resumed", async () => {
    let calls = 0;
    handler = (_, response) => {
      calls += 1;
      response.writeHead(200, { "Content-Type": "text/event-stream" });
      if (calls === 1) {
        response.write("retry: 1000\n\n"); // then silence: no heartbeat, no end
      } else {
        response.end(`event: end\ndata: {"run":null}\n\n`);
      }
    };
    const client = new TorenClient(url, { streamTimeout: 500 });
    const items = [];
    for await (const item of client.stream("run_1")) items.push(item);
    assert.deepEqual(items, []);
    assert.ok(calls >= 2, `reconnected after the silence (${calls} requests)`);
    server.closeAllConnections();
  });

  test("an error message ends the stream with its code", async () => {
    answer(
      200,
      `event: error\ndata: {"error":{"code":"internal_error","message":"the stream failed on the server; reconnect"}}\n\n`,
      "text/event-stream",
    );
    await assert.rejects(
      (async () => {
        for await (const _ of new TorenClient(url).stream("run_1")) assert.fail("no event expected");
      })(),
      { name: "TorenAPIError", code: "internal_error", status: 200 },
    );
  });
});

test("constructing a client with a URL that is not http(s) is a TypeError saying what is expected", () => {
  assert.throws(() => new TorenClient("127.0.0.1:8000"), {
    name: "TypeError",
    message: /baseUrl must be an http:\/\/ or https:\/\/ URL such as 'http:\/\/127\.0\.0\.1:8000'; got '127\.0\.0\.1:8000'/,
  });
});
