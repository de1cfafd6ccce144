/**
 * `@toren-run/client`: the TypeScript client for Toren's HTTP API (`/v1`).
 *
 *     import { TorenClient } from "@toren-run/client";
 *
 *     const client = new TorenClient("http://127.0.0.1:8000", { token: process.env.TOREN_API_TOKEN });
 *     const run = await client.startRun("support", { question: "Where is my order?" });
 *     for await (const item of client.stream(run.id, { deltas: true })) {
 *       if (item.kind === "delta") process.stdout.write(item.text);
 *       else console.log(item.seq, item.type);
 *     }
 */

export {
  TorenClient,
  type CallOptions,
  type ClientOptions,
  type EventsOptions,
  type ForkOptions,
  type ListRunsOptions,
  type PlanOptions,
  type RetryOptions,
  type SendMessageOptions,
  type StartRunOptions,
  type WaitOptions,
} from "./client.js";
export { TorenAPIError, TorenConnectionError, TorenError, TorenTimeoutError } from "./errors.js";
export {
  TERMINAL_EVENT_TYPES,
  isEventType,
  type EventError,
  type EventPayloads,
  type EventType,
  type ModelResponse,
  type TypedEvent,
} from "./events.js";
export type { StreamOptions } from "./stream.js";
export {
  TERMINAL_STATUSES,
  isTerminal,
  type Agent,
  type BackfillDone,
  type CreateSchedule,
  type Delta,
  type ErrorBody,
  type Event,
  type EventPage,
  type EventsQuery,
  type ForkRunRequest,
  type Health,
  type InvalidationExplained,
  type Lineage,
  type ListRunsQuery,
  type MessageAccepted,
  type PlanQuery,
  type PlanReport,
  type Ready,
  type RequestChange,
  type RetryRunRequest,
  type Run,
  type RunPage,
  type RunPlan,
  type RunStatus,
  type RunVerification,
  type Schedule,
  type StepCheck,
  type StreamEvent,
  type StreamFinding,
  type StreamItem,
  type Usage,
} from "./types.js";
export type { components, operations, paths } from "./generated/openapi.js";

/** This package's version; it releases in lockstep with the `toren-run` Python distribution. */
export const VERSION = "0.1.0";
