/**
 * Payloads of the event types of the log (format v1, docs/event-log.md). The HTTP API
 * describes a payload as any JSON object; these types say what each documented event type
 * carries. Readers must ignore types and fields they do not know (a newer server may add
 * some), so every payload keeps an index signature and `isEventType` narrows by `type`.
 */

import type { Event } from "./types.js";

export interface ModelResponse {
  text: string;
  tool_calls: { id: string; name: string; arguments: unknown; [key: string]: unknown }[];
  usage?: { input_tokens?: number; output_tokens?: number; [key: string]: unknown };
  finish_reason?: string | null;
  model?: string | null;
  [key: string]: unknown;
}

export interface EventError {
  type?: string;
  code?: string;
  message: string;
  /** When code raised (a tool, a child, agent code): the trimmed, redacted traceback. */
  traceback?: string;
  [key: string]: unknown;
}

export interface EventPayloads {
  RunStarted: { agent: string; process: string; input: unknown };
  ModelCallRecorded: {
    provider: string;
    model: string;
    message_list?: string;
    message_count?: number;
    tools?: string[];
    params?: Record<string, unknown>;
    response?: ModelResponse;
    error?: EventError;
    input_tokens?: number;
    output_tokens?: number;
    /** Decimal string, exact. */
    cost_usd?: string;
    latency_ms?: number;
  };
  ToolCallRecorded: {
    name: string;
    args: unknown;
    result?: unknown;
    error?: EventError;
    latency_ms?: number;
    reused_from_seq?: number | null;
  };
  ValueRecorded: { what: "now" | "random" | "uuid" | (string & {}); value: unknown };
  TimerScheduled: {
    fire_at: number;
    seconds: number;
    purpose: string;
    /** The duration or timeout as the code gave it (what the digest covers). */
    requested_seconds?: number;
    /** For `purpose: "message"`: the name waited for. */
    message?: string | null;
  };
  TimerFired: { fired_at: number };
  MessageReceived: { name: string; payload: unknown; inbox_id: number };
  ChildStarted: {
    process: string;
    input: unknown;
    child_stream: string;
    continues?: string | null;
  };
  ChildCompleted: { output?: unknown; error?: EventError };
  StreamInvalidated: {
    from_pos: number;
    expected_digest: string | null;
    actual_digest: string | null;
    expected_kind?: string | null;
    actual_kind?: string | null;
    code_version: string;
    cause: string;
  };
  RunWaiting: { not_before?: number | null; messages?: string[] | null };
  RunCompleted: { output: unknown };
  RunFailed: {
    error: EventError;
    /** The seqs of the recorded step failures that ended the run (`[]`: agent code or a limit). */
    failed_seqs?: number[];
  };
  /** A failed run queued again (`retry()`); the failures in `retried_seqs` run again live. */
  RunRetried: {
    attempt: number;
    failed_seq: number | null;
    error?: EventError | null;
    retried_seqs: number[];
    raise_limits: { max_steps?: number; max_cost_usd?: number };
    code_version: string;
  };
  /** The start of a forked run's log (`fork()`): the source and the fork point. */
  RunForked: {
    source_run: string;
    stream: string;
    position: number;
    source_seq: number;
    pins: Record<string, number>;
    input_changed: boolean;
  };
  RunCancelled: { reason?: string | null };
}

export type EventType = keyof EventPayloads;

/** An event whose `type` is known, with its payload typed. */
export type TypedEvent<T extends EventType = EventType> = {
  [K in T]: Omit<Event, "type" | "payload"> & {
    type: K;
    payload: EventPayloads[K] & Record<string, unknown>;
  };
}[T];

/** The event types that end a run (after one of them the stream sends `end`). */
export const TERMINAL_EVENT_TYPES: readonly EventType[] = [
  "RunCompleted",
  "RunFailed",
  "RunCancelled",
];

/**
 * Narrows an event (from `events()` or `stream()`) to one type with its typed payload:
 *
 *     if (isEventType(event, "ModelCallRecorded")) console.log(event.payload.response?.text);
 */
export function isEventType<T extends EventType, E extends { type: string }>(
  event: E,
  ...types: T[]
): event is E & TypedEvent<T> {
  return (types as string[]).includes(event.type);
}
