import { TorenAPIError, TorenConnectionError, TorenTimeoutError } from "./errors.js";
import { Redactor } from "./redact.js";
import { followStream, type StreamOptions, type StreamSettings } from "./stream.js";
import { describe, errorFromBody, linkSignals, sleep } from "./util.js";
import {
  isTerminal,
  type Agent,
  type BackfillDone,
  type CreateSchedule,
  type EventPage,
  type EventsQuery,
  type Event,
  type ForkRunRequest,
  type Health,
  type InvalidationExplained,
  type ListRunsQuery,
  type MessageAccepted,
  type PlanQuery,
  type PlanReport,
  type Ready,
  type RetryRunRequest,
  type Run,
  type RunPage,
  type RunVerification,
  type Schedule,
  type ScheduleList,
  type StreamEvent,
  type StreamItem,
} from "./types.js";

export interface ClientOptions {
  /** Sent as `Authorization: Bearer <token>`. */
  token?: string;
  /** Sent as `X-API-Key: <apiKey>` (the API accepts either header). */
  apiKey?: string;
  /** Milliseconds a request may take (default 30 000). Streams are bounded by `streamTimeout`. */
  timeout?: number;
  /**
   * Milliseconds a stream waits for a byte (default 60 000; the server sends a heartbeat
   * every 15 s) before it treats the connection as dead and resumes.
   */
  streamTimeout?: number;
  /** Failed reconnections in a row before a stream gives up (default 8, about 9 s). */
  maxReconnects?: number;
  /** Headers added to every request. */
  headers?: Record<string, string>;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
}

/** Every call takes an optional `signal`: aborting it rejects the call with its reason. */
export interface CallOptions {
  signal?: AbortSignal;
}

export interface StartRunOptions extends CallOptions {
  /** The agent's process (default `main`). */
  process?: string;
  /** The same key returns the same run; reusing it with other arguments is a 409. */
  idempotencyKey?: string;
}

export interface SendMessageOptions extends CallOptions {
  /** Receives the server's warning when the run waits for other names (default `console.warn`). */
  onWarning?: (warning: string) => void;
}

export interface RetryOptions extends CallOptions {
  /** Raise the run's `limits.max_steps` for this run (a retry never lowers a limit). */
  maxSteps?: RetryRunRequest["max_steps"];
  /** Raise the run's `limits.max_cost_usd` (USD) for this run. */
  maxCostUsd?: RetryRunRequest["max_cost_usd"];
}

export interface ForkOptions extends CallOptions {
  /**
   * The new run's input. Left out (or `undefined`): the source run's input; `null` is an
   * input like any other JSON value.
   */
  input?: ForkRunRequest["input"];
}

export type ListRunsOptions = ListRunsQuery & CallOptions;
export type EventsOptions = EventsQuery & CallOptions;
export type PlanOptions = PlanQuery & CallOptions;

export interface WaitOptions extends CallOptions {
  /** Milliseconds to wait for the run to end (default 60 000). */
  timeout?: number;
}

type Query = Record<string, string | number | undefined | null>;

interface Call<T> {
  method: "GET" | "POST" | "DELETE";
  path: string;
  query?: Query;
  body?: unknown;
  parse: (data: unknown) => T;
  signal?: AbortSignal | undefined;
}

/**
 * A client for Toren's HTTP API (`/v1`), on Node >= 20 and in browsers (it only needs
 * `fetch`). It mirrors the Python `toren.client.AsyncTorenClient`:
 *
 *     const client = new TorenClient("http://127.0.0.1:8000", { token: "s3cret" });
 *     const run = await client.startRun("support", { question: "Where is my order?" });
 *     for await (const event of client.stream(run.id)) console.log(event.seq, event.type);
 */
export class TorenClient {
  readonly baseUrl: string;
  private readonly headers: Record<string, string>;
  private readonly timeout: number;
  private readonly redact: Redactor;
  private readonly fetchImpl: typeof fetch;
  private readonly streamSettings: StreamSettings;

  constructor(baseUrl: string, options: ClientOptions = {}) {
    if (!/^https?:\/\//i.test(baseUrl)) {
      throw new TypeError(
        `baseUrl must be an http:// or https:// URL such as 'http://127.0.0.1:8000'; got '${baseUrl}'`,
      );
    }
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.headers = { Accept: "application/json", ...options.headers };
    if (options.token) this.headers["Authorization"] = `Bearer ${options.token}`;
    if (options.apiKey) this.headers["X-API-Key"] = options.apiKey;
    this.timeout = options.timeout ?? 30_000;
    this.redact = new Redactor([options.token, options.apiKey]);
    const fetchImpl = options.fetch ?? globalThis.fetch;
    if (typeof fetchImpl !== "function") {
      throw new TypeError("no fetch: pass options.fetch or use Node >= 20 or a browser");
    }
    this.fetchImpl = fetchImpl.bind(globalThis);
    this.streamSettings = {
      streamTimeout: options.streamTimeout ?? 60_000,
      maxReconnects: options.maxReconnects ?? 8,
    };
  }

  // -- runs -------------------------------------------------------------------------------

  /** `POST /v1/runs`: start a run of `agent` (201), or get the run `idempotencyKey` names (200). */
  startRun(agent: string, input: unknown = null, options: StartRunOptions = {}): Promise<Run> {
    const body: Record<string, unknown> = { agent, process: options.process ?? "main", input };
    if (options.idempotencyKey !== undefined) body["idempotency_key"] = options.idempotencyKey;
    return this.send({
      method: "POST",
      path: "/v1/runs",
      body,
      parse: runOf,
      signal: options.signal,
    });
  }

  /** `GET /v1/runs/{id}`. */
  getRun(runId: string, options: CallOptions = {}): Promise<Run> {
    return this.send({ method: "GET", path: runPath(runId), parse: runOf, signal: options.signal });
  }

  /** `GET /v1/runs`: one page of runs, newest first, filtered by status, agent and process. */
  listRuns(options: ListRunsOptions = {}): Promise<RunPage> {
    const { signal, ...query } = options;
    return this.send({
      method: "GET",
      path: "/v1/runs",
      query,
      parse: (data) => {
        const page = objectWith(data, "runs") as RunPage;
        if (!Array.isArray(page.runs)) throw invalid("'runs' is not a list");
        return page;
      },
      signal,
    });
  }

  /** Every run matching the filters, newest first, fetching page after page (`limit` each). */
  async *iterRuns(options: ListRunsOptions = {}): AsyncGenerator<Run, void, undefined> {
    let cursor = options.cursor;
    for (;;) {
      const page = await this.listRuns({ ...options, cursor });
      yield* page.runs;
      if (!page.next_cursor) return;
      cursor = page.next_cursor;
    }
  }

  /** `GET /v1/runs/{id}/events`: one page of the run's log after seq `after`. */
  events(runId: string, options: EventsOptions = {}): Promise<EventPage> {
    const { signal, ...query } = options;
    return this.send({
      method: "GET",
      path: runPath(runId, "/events"),
      query: { after: 0, limit: 100, ...query },
      parse: (data) => {
        const page = objectWith(data, "events") as EventPage;
        if (!Array.isArray(page.events)) throw invalid("'events' is not a list");
        return page;
      },
      signal,
    });
  }

  /** The run's whole log from `after` on (as it is now), page after page. */
  async *iterEvents(runId: string, options: EventsOptions = {}): AsyncGenerator<Event, void> {
    let after = options.after ?? 0;
    for (;;) {
      const page = await this.events(runId, { ...options, after });
      yield* page.events;
      if (page.next_after === null || page.next_after === undefined) return;
      after = page.next_after;
    }
  }

  /**
   * `POST /v1/runs/{id}/messages`: send a message the run takes with
   * `ctx.wait_for_message(name)`. Returns the message's id. A finished run is a 409
   * `run_finished`. A run waiting for other names keeps the message (a later wait for
   * its name takes it) but is not woken: the server's warning, which names the names the
   * run waits for, goes to `options.onWarning` (default `console.warn`).
   */
  async sendMessage(
    runId: string,
    name: string,
    payload: unknown = null,
    options: SendMessageOptions = {},
  ): Promise<number> {
    const accepted = await this.send({
      method: "POST",
      path: runPath(runId, "/messages"),
      body: { name, payload },
      parse: (data) => objectWith(data, "message_id") as MessageAccepted,
      signal: options.signal,
    });
    if (typeof accepted.warning === "string" && accepted.warning) {
      (options.onWarning ?? console.warn)(accepted.warning);
    }
    return accepted.message_id;
  }

  /** `POST /v1/runs/{id}/cancel`: request cancellation; the run ends `cancelled` soon after. */
  cancel(runId: string, options: CallOptions = {}): Promise<Run> {
    return this.send({
      method: "POST",
      path: runPath(runId, "/cancel"),
      parse: runOf,
      signal: options.signal,
    });
  }

  /**
   * `POST /v1/runs/{id}/retry`: queue a failed run again under the code now deployed
   * (202, the run `queued` with `retries` one higher). Its recorded successful steps
   * replay for free and the failure that ended it runs again live. `maxSteps` /
   * `maxCostUsd` raise its limits. A run that is not `failed` (completed: fork it;
   * cancelled: final; still going) is a 409 `run_not_retryable`; a run whose agent is no
   * longer deployed a 404 `agent_not_found`.
   */
  retry(runId: string, options: RetryOptions = {}): Promise<Run> {
    const body: RetryRunRequest = {};
    if (options.maxSteps !== undefined && options.maxSteps !== null) body.max_steps = options.maxSteps;
    if (options.maxCostUsd !== undefined && options.maxCostUsd !== null) {
      body.max_cost_usd = options.maxCostUsd;
    }
    return this.send({
      method: "POST",
      path: runPath(runId, "/retry"),
      body,
      parse: runOf,
      signal: options.signal,
    });
  }

  /**
   * `POST /v1/runs/{id}/fork`: a new run (201, `queued`, `forked_from` `{run_id, at}`)
   * whose steps before `at` (`STREAM:POSITION`, e.g. `main:2`) replay from this run's log
   * without being paid again, and which runs live from there under the code now deployed.
   * The source run is not changed. A fork point the run does not have is a 422
   * `invalid_input`; an `at` that is not `STREAM:POSITION` a 422 `invalid_request`.
   */
  fork(runId: string, at: string, options: ForkOptions = {}): Promise<Run> {
    const body: ForkRunRequest = { at };
    if (options.input !== undefined) body.input = options.input;
    return this.send({
      method: "POST",
      path: runPath(runId, "/fork"),
      body,
      parse: runOf,
      signal: options.signal,
    });
  }

  /**
   * `GET /v1/runs/{id}/verify`: every recorded step's request digest re-derived by the
   * server from the stored events and blobs; `ok` is false when one mismatches (the same
   * report as `toren runs verify RUN --json`).
   */
  verify(runId: string, options: CallOptions = {}): Promise<RunVerification> {
    return this.send({
      method: "GET",
      path: runPath(runId, "/verify"),
      parse: (data) => {
        const report = objectWith(data, "checks") as RunVerification;
        if (!Array.isArray(report.checks)) throw invalid("'checks' is not a list");
        return report;
      },
      signal: options.signal,
    });
  }

  /**
   * `GET /v1/runs/{id}/invalidations`: every `StreamInvalidated` of the run, with the parts
   * of the request that changed there (`changes`; empty, with a `note` saying why, when
   * there is nothing to compare). `[]` for a run never invalidated.
   */
  async invalidations(runId: string, options: CallOptions = {}): Promise<InvalidationExplained[]> {
    const list = await this.send({
      method: "GET",
      path: runPath(runId, "/invalidations"),
      parse: (data) => {
        const body = objectWith(data, "invalidations") as { invalidations: InvalidationExplained[] };
        if (!Array.isArray(body.invalidations)) throw invalid("'invalidations' is not a list");
        return body;
      },
      signal: options.signal,
    });
    return list.invalidations;
  }

  // -- schedules (docs/schedules.md); a schedule's id is "agent/name" ----------------------

  /** `GET /v1/schedules`: every schedule, with its next times, last run and last skip. */
  async schedules(options: CallOptions = {}): Promise<Schedule[]> {
    const list = await this.send({
      method: "GET",
      path: "/v1/schedules",
      parse: (data) => {
        const body = objectWith(data, "schedules") as ScheduleList;
        if (!Array.isArray(body.schedules)) throw invalid("'schedules' is not a list");
        return body;
      },
      signal: options.signal,
    });
    return list.schedules;
  }

  /** `GET /v1/schedules/{agent}/{name}`: one schedule with its recent runs. */
  getSchedule(scheduleId: string, options: CallOptions = {}): Promise<Schedule> {
    return this.send({
      method: "GET",
      path: schedulePath(scheduleId),
      parse: scheduleOf,
      signal: options.signal,
    });
  }

  /**
   * `POST /v1/schedules`: a schedule made at run time. `spec` holds `cron` or `every` and
   * the other keys of an agent.yaml schedule (`zone`, `input`, `process`, `overlap`, ...).
   * A bad definition is a 422 naming the field.
   */
  createSchedule(
    agent: string,
    name: string,
    spec: Partial<Omit<CreateSchedule, "agent" | "name">>,
    options: CallOptions = {},
  ): Promise<Schedule> {
    return this.send({
      method: "POST",
      path: "/v1/schedules",
      body: { ...spec, agent, name },
      parse: scheduleOf,
      signal: options.signal,
    });
  }

  /** `POST .../pause`: no time fires until it is resumed; `note` says why. */
  pauseSchedule(scheduleId: string, note?: string, options: CallOptions = {}): Promise<Schedule> {
    return this.send({
      method: "POST",
      path: schedulePath(scheduleId, "/pause"),
      body: note === undefined ? {} : { note },
      parse: scheduleOf,
      signal: options.signal,
    });
  }

  /** `POST .../resume`: from the next time after now (paused times are not caught up). */
  resumeSchedule(scheduleId: string, note?: string, options: CallOptions = {}): Promise<Schedule> {
    return this.send({
      method: "POST",
      path: schedulePath(scheduleId, "/resume"),
      body: note === undefined ? {} : { note },
      parse: scheduleOf,
      signal: options.signal,
    });
  }

  /** `POST .../trigger`: start a run of the schedule now. */
  triggerSchedule(scheduleId: string, options: CallOptions = {}): Promise<Run> {
    return this.send({
      method: "POST",
      path: schedulePath(scheduleId, "/trigger"),
      parse: runOf,
      signal: options.signal,
    });
  }

  /**
   * `POST .../backfill`: a run for each nominal time in `[start, end)` (ISO 8601 with an
   * offset) that has none yet; the same backfill twice starts nothing the second time.
   */
  backfillSchedule(
    scheduleId: string,
    start: string,
    end: string,
    options: CallOptions = {},
  ): Promise<BackfillDone> {
    return this.send({
      method: "POST",
      path: schedulePath(scheduleId, "/backfill"),
      body: { start, end },
      parse: (data) => objectWith(data, "started") as unknown as BackfillDone,
      signal: options.signal,
    });
  }

  /** `DELETE /v1/schedules/{agent}/{name}`: remove it (its runs stay). */
  async deleteSchedule(scheduleId: string, options: CallOptions = {}): Promise<void> {
    await this.send({
      method: "DELETE",
      path: schedulePath(scheduleId),
      parse: () => undefined,
      signal: options.signal,
    });
  }

  /** Until the run is completed, failed or cancelled; `TorenTimeoutError` after `timeout` ms. */
  async wait(runId: string, options: WaitOptions = {}): Promise<Run> {
    const timeout = options.timeout ?? 60_000;
    const deadline = Date.now() + timeout;
    let delay = 20;
    for (;;) {
      const run = await this.getRun(runId, options);
      if (isTerminal(run)) return run;
      const left = deadline - Date.now();
      if (left <= 0) throw new TorenTimeoutError(runId, run.status, timeout);
      await sleep(Math.min(delay, left), options.signal);
      delay = Math.min(delay * 2, 1000);
    }
  }

  // -- streaming --------------------------------------------------------------------------

  /**
   * `GET /v1/runs/{id}/stream`: the run's events after seq `after` (default: the whole
   * log), then live, until the run ends (the iterator then finishes). A dropped connection
   * or a restarted server is resumed with `Last-Event-ID`: every event arrives once, in
   * order. With `deltas: true` the model's tokens arrive as `Delta`s while a call runs.
   * An unknown run rejects with `run_not_found`; a stream the server cannot continue
   * (e.g. an `after` that is not one of the run's events) with its error code.
   */
  stream(
    runId: string,
    options: StreamOptions & { deltas: true },
  ): AsyncGenerator<StreamItem, Run | null>;
  stream(runId: string, options?: StreamOptions): AsyncGenerator<StreamEvent, Run | null>;
  stream(runId: string, options: StreamOptions = {}): AsyncGenerator<StreamItem, Run | null> {
    return followStream(
      {
        url: this.url(runPath(runId, "/stream")),
        headers: this.headers,
        fetch: this.fetchImpl,
        redact: this.redact,
        settings: this.streamSettings,
        describe: `the stream of run '${runId}'`,
      },
      options,
    );
  }

  // -- agents and operations --------------------------------------------------------------

  /** `GET /v1/agents`: the agents the server resolves, with their processes. */
  async agents(options: CallOptions = {}): Promise<Agent[]> {
    const list = await this.send({
      method: "GET",
      path: "/v1/agents",
      parse: (data) => objectWith(data, "agents") as { agents: Agent[] },
      signal: options.signal,
    });
    return list.agents;
  }

  /** `GET /v1/health`: liveness and the server's version (no token needed). */
  health(options: CallOptions = {}): Promise<Health> {
    return this.send({
      method: "GET",
      path: "/v1/health",
      parse: (data) => objectWith(data, "status") as Health,
      signal: options.signal,
    });
  }

  /** `GET /v1/ready`: the database answers (a 503 `not_ready` otherwise). */
  ready(options: CallOptions = {}): Promise<Ready> {
    return this.send({
      method: "GET",
      path: "/v1/ready",
      parse: (data) => objectWith(data, "status") as Ready,
      signal: options.signal,
    });
  }

  /**
   * `GET /v1/plan`: the replay plan of the server's in-flight runs against the code it
   * resolves now: which streams would be invalidated, from which step, at what cost.
   */
  plan(options: PlanOptions = {}): Promise<PlanReport> {
    const { signal, ...query } = options;
    return this.send({
      method: "GET",
      path: "/v1/plan",
      query,
      parse: (data) => objectWith(data, "plans") as PlanReport,
      signal,
    });
  }

  // -- plumbing ---------------------------------------------------------------------------

  private url(path: string, query: Query = {}): string {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(query)) {
      if (value !== undefined && value !== null) params.set(key, String(value));
    }
    const search = params.toString();
    return `${this.baseUrl}${path}${search ? `?${search}` : ""}`;
  }

  private async send<T>(call: Call<T>): Promise<T> {
    const headers = { ...this.headers };
    if (call.body !== undefined) headers["Content-Type"] = "application/json";
    const deadline = new AbortController();
    const timer = setTimeout(() => deadline.abort(), this.timeout);
    const { signal, dispose } = linkSignals([call.signal, deadline.signal]);
    const url = this.url(call.path, call.query);
    let status = 0;
    let text: string;
    try {
      const response = await this.fetchImpl(url, {
        method: call.method,
        headers,
        body: call.body === undefined ? null : JSON.stringify(call.body),
        signal,
        redirect: "manual",
      });
      status = response.status;
      text = await response.text();
      if (status < 200 || status >= 300) {
        throw this.errorFrom(status, response.statusText, text);
      }
    } catch (error) {
      if (error instanceof TorenAPIError) throw error;
      if (call.signal?.aborted) throw call.signal.reason;
      const what = deadline.signal.aborted
        ? `no answer from ${this.baseUrl} within ${this.timeout / 1000}s`
        : `cannot reach ${this.baseUrl}: ${describe(error)}`;
      throw new TorenConnectionError(this.redact.text(what), { cause: error });
    } finally {
      clearTimeout(timer);
      dispose();
    }
    if (status === 204) return call.parse(null); // No Content (a deleted schedule)
    let data: unknown;
    try {
      data = JSON.parse(text);
    } catch {
      throw this.apiError(
        status,
        "invalid_response",
        `${call.method} ${call.path} answered HTTP ${status} with a body that is not JSON: ` +
          `${JSON.stringify(text.slice(0, 200))}; expected the API's JSON (is ${this.baseUrl} a Toren server?)`,
      );
    }
    try {
      return call.parse(data);
    } catch (error) {
      if (!(error instanceof InvalidShape)) throw error;
      throw this.apiError(
        status,
        "invalid_response",
        `${call.method} ${call.path} answered HTTP ${status} with JSON of another shape: ` +
          `${error.message} (is ${this.baseUrl} a Toren server?)`,
      );
    }
  }

  private errorFrom(status: number, statusText: string, text: string): TorenAPIError {
    return errorFromBody(this.redact, status, statusText, text);
  }

  private apiError(status: number, code: string, message: string): TorenAPIError {
    return new TorenAPIError(status, code, this.redact.text(message));
  }
}

class InvalidShape extends Error {}

function invalid(message: string): InvalidShape {
  return new InvalidShape(message);
}

function objectWith(data: unknown, key: string): Record<string, unknown> {
  if (data === null || typeof data !== "object" || Array.isArray(data)) {
    throw invalid(`expected a JSON object, got ${Array.isArray(data) ? "an array" : typeof data}`);
  }
  if (!(key in data)) throw invalid(`the object has no '${key}'`);
  return data as Record<string, unknown>;
}

function runOf(data: unknown): Run {
  const run = objectWith(data, "id");
  if (typeof run["status"] !== "string") throw invalid("the run has no 'status'");
  return run as unknown as Run;
}

function scheduleOf(data: unknown): Schedule {
  const schedule = objectWith(data, "id");
  if (typeof schedule["paused"] !== "boolean") throw invalid("the schedule has no 'paused'");
  return schedule as unknown as Schedule;
}

function schedulePath(scheduleId: string, suffix = ""): string {
  const slash = scheduleId.indexOf("/");
  if (slash <= 0 || slash === scheduleId.length - 1) {
    throw new TypeError(`a schedule id is "agent/name"; got ${JSON.stringify(scheduleId)}`);
  }
  const agent = scheduleId.slice(0, slash);
  const name = scheduleId.slice(slash + 1);
  return `/v1/schedules/${encodeURIComponent(agent)}/${encodeURIComponent(name)}${suffix}`;
}

function runPath(runId: string, suffix = ""): string {
  return `/v1/runs/${encodeURIComponent(runId)}${suffix}`;
}

