/**
 * Following a run's Server-Sent Events stream, resuming after every break.
 *
 * The server sends each event of the log once, in order, with its seq as the SSE id; a
 * request with `Last-Event-ID: <seq>` goes on after that event. So the client keeps the
 * last seq it delivered and, when the connection drops, the server restarts or goes
 * silent for longer than `streamTimeout` (it sends a heartbeat every 15 s), reconnects
 * with it: nothing is missed and nothing repeated. The stream ends cleanly on the `end`
 * message the server sends after the terminal event of the run's current attempt. An
 * `end` whose run is not terminal (an older server ends at the `RunFailed` before a
 * retry) is not the end: the client reconnects after the last event and reads on.
 */

import { createParser, type EventSourceMessage } from "eventsource-parser";

import { TorenAPIError, TorenConnectionError } from "./errors.js";
import type { Redactor } from "./redact.js";
import { isTerminal, type Delta, type Event, type Run, type StreamEvent, type StreamItem } from "./types.js";
import { describe, errorFromBody, linkSignals, sleep } from "./util.js";

export interface StreamOptions {
  /** Start after this seq (default 0: the whole log, then live). */
  after?: number;
  /** Also yield the model's output tokens (`Delta`s) while a call is in flight. */
  deltas?: boolean;
  /** Aborting it ends the stream: the iterator rejects with the signal's reason. */
  signal?: AbortSignal;
}

export interface StreamSettings {
  streamTimeout: number;
  maxReconnects: number;
}

export interface StreamTarget {
  url: string;
  headers: Record<string, string>;
  fetch: typeof fetch;
  redact: Redactor;
  settings: StreamSettings;
  describe: string;
}

/** Statuses a proxy or load balancer answers while the server behind it restarts. */
const TRANSIENT = new Set([502, 503, 504]);

class Silence extends Error {}

/**
 * The stream's items until the run ends; the generator's return value is the final run
 * (from the `end` message).
 */
export async function* followStream(
  target: StreamTarget,
  options: StreamOptions,
): AsyncGenerator<StreamItem, Run | null, undefined> {
  const { signal: userSignal, deltas = false } = options;
  const state = { last: options.after ?? 0, ended: false, final: null as Run | null };
  let failures = 0;
  for (;;) {
    if (userSignal?.aborted) throw userSignal.reason;
    const attempt = new AbortController();
    const { signal, dispose } = linkSignals([userSignal, attempt.signal]);
    let why: unknown = "the server closed the stream before the run ended";
    try {
      const body = await connect(target, state.last, signal, attempt);
      for await (const message of messages(body, target.settings.streamTimeout, attempt)) {
        failures = 0;
        const item = handle(target, state, message, deltas);
        if (item !== null) yield item;
        if (state.ended) return state.final;
      }
    } catch (error) {
      if (error instanceof TorenAPIError && !(error instanceof Transient)) throw error;
      if (userSignal?.aborted) throw userSignal.reason;
      why = attempt.signal.reason instanceof Silence ? attempt.signal.reason : error;
    } finally {
      attempt.abort();
      dispose();
    }
    failures += 1;
    if (failures > target.settings.maxReconnects) {
      throw new TorenConnectionError(
        target.redact.text(
          `${target.describe} broke ${failures} times in a row (last after event ` +
            `${state.last}): ${describe(why)}`,
        ),
        { cause: why },
      );
    }
    await sleep(backoff(failures), userSignal);
  }
}

/** An answer worth retrying: a proxy's 502/503/504 while the server restarts. */
class Transient extends TorenAPIError {}

/**
 * Opens the stream after seq `last` and returns its body. Throws the API's error, a
 * `Transient` one, or (through `attempt`) a `Silence` when no answer comes in time.
 */
async function connect(
  target: StreamTarget,
  last: number,
  signal: AbortSignal,
  attempt: AbortController,
): Promise<ReadableStream<Uint8Array>> {
  const timeout = target.settings.streamTimeout;
  const timer = setTimeout(() => attempt.abort(new Silence(`no answer for ${timeout / 1000}s`)), timeout);
  try {
    const response = await target.fetch(`${target.url}?after=${last}`, {
      headers: {
        ...target.headers,
        Accept: "text/event-stream",
        ...(last ? { "Last-Event-ID": String(last) } : {}),
      },
      signal,
      cache: "no-store",
      redirect: "manual",
    });
    if (response.status !== 200 || !response.body) {
      const text = await response.text();
      const error = errorFromBody(target.redact, response.status, response.statusText, text);
      if (!TRANSIENT.has(response.status)) throw error;
      throw new Transient(error.status, error.code, error.message, error.details);
    }
    const type = response.headers.get("content-type") ?? "";
    if (!type.startsWith("text/event-stream")) {
      throw malformed(target, `HTTP 200 with Content-Type '${type}' instead of an event stream`);
    }
    return response.body;
  } finally {
    clearTimeout(timer);
  }
}

/** The SSE messages of `body`; a `Silence` (through `attempt`) after `timeout` ms without a byte. */
async function* messages(
  body: ReadableStream<Uint8Array>,
  timeout: number,
  attempt: AbortController,
): AsyncGenerator<EventSourceMessage> {
  const pending: EventSourceMessage[] = [];
  const parser = createParser({ onEvent: (message) => pending.push(message) });
  const reader = body.getReader();
  const decoder = new TextDecoder();
  try {
    for (;;) {
      const chunk = await readWithin(reader, timeout, attempt);
      if (chunk === null) return;
      parser.feed(decoder.decode(chunk, { stream: true }));
      while (pending.length > 0) yield pending.shift() as EventSourceMessage;
    }
  } finally {
    reader.cancel().catch(() => undefined);
  }
}

/** The next chunk of the body, null at its end; a `Silence` after `timeout` ms without one. */
async function readWithin(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  timeout: number,
  attempt: AbortController,
): Promise<Uint8Array | null> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const silence = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const error = new Silence(`no byte for ${timeout / 1000}s (the server sends heartbeats)`);
      attempt.abort(error);
      reject(error);
    }, timeout);
  });
  try {
    const { done, value } = await Promise.race([reader.read(), silence]);
    return done ? null : value;
  } finally {
    clearTimeout(timer);
  }
}

function handle(
  target: StreamTarget,
  state: { last: number; ended: boolean; final: Run | null },
  message: EventSourceMessage,
  deltas: boolean,
): StreamItem | null {
  switch (message.event) {
    case "event": {
      const event = parse(target, message) as Event;
      if (typeof event.seq !== "number") throw malformed(target, "an event without a seq");
      if (event.seq <= state.last) return null; // delivered already (the server never repeats)
      state.last = event.seq;
      return { ...event, kind: "event" } satisfies StreamEvent;
    }
    case "delta": {
      if (!deltas) return null;
      const data = parse(target, message) as Partial<Delta>;
      return {
        kind: "delta",
        stream: String(data.stream ?? ""),
        position: typeof data.position === "number" ? data.position : null,
        text: String(data.text ?? ""),
      };
    }
    case "end": {
      const run = ((parse(target, message) as { run?: Run | null }).run ?? null) as Run | null;
      // A run retried after its RunFailed is live again: not its end (see the top).
      if (run !== null && !isTerminal(run)) return null;
      state.ended = true;
      state.final = run;
      return null;
    }
    case "error": {
      const data = parse(target, message) as { error?: { code?: unknown; message?: unknown } };
      throw new TorenAPIError(
        200,
        String(data.error?.code ?? "stream_error"),
        target.redact.text(String(data.error?.message ?? "")),
      );
    }
    default:
      return null; // an SSE message a newer server sends: ignored, as the API asks
  }
}

function parse(target: StreamTarget, message: EventSourceMessage): Record<string, unknown> {
  try {
    const data: unknown = JSON.parse(message.data);
    if (data !== null && typeof data === "object" && !Array.isArray(data)) {
      return data as Record<string, unknown>;
    }
  } catch {
    // reported below
  }
  throw malformed(target, `a '${message.event}' message whose data is not a JSON object`);
}

function malformed(target: StreamTarget, what: string): TorenAPIError {
  return new TorenAPIError(
    200,
    "invalid_response",
    target.redact.text(`${target.describe} sent ${what}; expected the API's SSE messages`),
  );
}

/** Milliseconds before reconnection attempt `failures`: 100, 200, 400 ... at most 2000. */
export function backoff(failures: number): number {
  return Math.min(100 * 2 ** Math.max(failures - 1, 0), 2000);
}
