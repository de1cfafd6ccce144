/**
 * The API's bodies, named. Every type here is an alias of the one generated from the
 * OpenAPI document (`src/generated/openapi.ts`, by openapi-typescript; a test fails when
 * it is stale), so the client cannot drift from the server's contract.
 */

import type { components, operations } from "./generated/openapi.js";

type Schemas = components["schemas"];

export type Run = Schemas["Run"];
export type RunStatus = Run["status"];
export type Usage = Schemas["Usage"];
/** One page of runs: `next_cursor` is the `cursor` of the next (older) page, or null. */
export type RunPage = Schemas["RunList"];
/** One event of a run's log. `seq` orders events and is the SSE id. */
export type Event = Schemas["Event"];
/** One page of a run's events: `next_after` is the `after` of the next page, or null. */
export type EventPage = Schemas["EventList"];
export type Agent = Schemas["AgentInfo"];
export type Health = Schemas["Health"];
export type Ready = Schemas["Ready"];
export type PlanReport = Schemas["PlanReport"];
export type RunPlan = Schemas["RunPlan"];
export type StreamFinding = Schemas["StreamFinding"];
export type MessageAccepted = Schemas["MessageAccepted"];
/** Where a forked run comes from: `{run_id, at}` (`at` is `STREAM:POSITION`). */
export type Lineage = Schemas["Lineage"];
/** The body of `POST /v1/runs/{id}/retry`: limits to raise for the run (`max_steps`, `max_cost_usd`). */
export type RetryRunRequest = Schemas["RetryRunRequest"];
/** The body of `POST /v1/runs/{id}/fork`: `at` (`STREAM:POSITION`) and, optionally, `input`. */
export type ForkRunRequest = Schemas["ForkRunRequest"];
/** `GET /v1/runs/{id}/verify`: every recorded step's digest re-derived (`ok` unless one mismatches). */
export type RunVerification = Schemas["RunVerification"];
/** One step of a `RunVerification`: `verdict` is `verified`, `unverifiable` or `mismatch`. */
export type StepCheck = Schemas["StepCheck"];
/** One invalidation of a run and the parts of the request that changed there. */
export type InvalidationExplained = Schemas["InvalidationExplained"];
/** One part of a step's request that differs (`part`, `text`, `name`, `index`, `old`, `new`). */
export type RequestChange = Schemas["RequestChange"];
export type ErrorBody = Schemas["ErrorBody"];
/** A schedule: its definition, next times, last run and last skip (docs/schedules.md). */
export type Schedule = Schemas["Schedule"];
export type ScheduleList = Schemas["ScheduleList"];
/** The body of `POST /v1/schedules`: `agent`, `name`, `cron` or `every`, and the rest. */
export type CreateSchedule = Schemas["CreateSchedule"];
/** What a backfill did: runs `started`, times that `already_ran`, and times the agent's concurrency `refused`. */
export type BackfillDone = Schemas["BackfillDone"];

/** The filters and page of `GET /v1/runs` (`status`, `agent`, `process`, `limit`, `cursor`). */
export type ListRunsQuery = NonNullable<operations["list_runs"]["parameters"]["query"]>;
/** The page of `GET /v1/runs/{id}/events` (`after`, `limit`). */
export type EventsQuery = NonNullable<operations["list_events"]["parameters"]["query"]>;
/** `GET /v1/plan`'s `limit`. */
export type PlanQuery = NonNullable<operations["plan"]["parameters"]["query"]>;

/** The statuses after which a run never changes again. */
export const TERMINAL_STATUSES: readonly RunStatus[] = ["completed", "failed", "cancelled"];

export function isTerminal(run: Pick<Run, "status">): boolean {
  return TERMINAL_STATUSES.includes(run.status);
}

/** An event of the log as `stream()` yields it: the event, tagged `kind: "event"`. */
export type StreamEvent = Event & { kind: "event" };

/**
 * A chunk of model output while the call is in flight (`stream(..., { deltas: true })`).
 * Not part of the log: a reconnect does not replay it, and the `ModelCallRecorded` event
 * that follows holds the whole response.
 */
export interface Delta {
  kind: "delta";
  stream: string;
  position: number | null;
  text: string;
}

export type StreamItem = StreamEvent | Delta;
