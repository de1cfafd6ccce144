"""The HTTP API's request and response bodies (pydantic, so the OpenAPI document is exact).

These models are the published ``/v1`` contract: within a major version fields are only
added, never renamed or removed, and a deprecated field is still accepted for one more
minor. Domain objects (``RunRecord``, ``Event``) stay frozen dataclasses; their
``to_dict`` is what these models describe.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from toren.agents.config import NAME_PATTERN
from toren.core.contract.inputs import MESSAGE_NAME_PATTERN, check_depth
from toren.core.contract.values import InvalidationCause, RunStatus
from toren.errors import InvalidInput

# Agent and process names follow agent.yaml's rule (one source of truth): an API that
# accepted fewer names could not start some loadable agents.
NAME_HELP = (
    "letters, digits, '.', '_' or '-', starting with a letter or digit, at most 64 characters"
)
# Identifiers stored as plain text columns: visible ASCII only (no NUL, no control
# characters, which PostgreSQL text columns reject and headers cannot carry).
KEY_PATTERN = r"^[\x21-\x7e]{1,255}$"
# A cursor is a run id (the last run of the previous page) as toren.core.drivers.runs.new_run_id
# makes them: anything else would be compared as a string and page silently wrong.
CURSOR_PATTERN = r"^run_[0-9a-f]{22}$"
CURSOR_HELP = (
    "the next_cursor of the previous page: a run id, 'run_' and 22 lowercase hex digits "
    "(e.g. 'run_0190c2a5e1f3a1b2c3d4e5'); omit it for the first page"
)
MAX_SEQ = 2**63 - 1


def _ascii_int(value: Any) -> Any:
    """Query and path integers are ASCII digits only. Python's ``int()`` (and pydantic's
    lax mode) also take ``'٢'``, ``' 5'``, ``'+5'``, ``'5_0'`` and ``'5.0'``: one number
    with many spellings, which a proxy, a cache or a log reader would not see as equal."""
    digits = value[1:] if isinstance(value, str) and value.startswith("-") else value
    if isinstance(value, str) and not (digits.isascii() and digits.isdigit() and len(digits) <= 19):
        raise ValueError(f"{value[:40]!r} is not a whole number; use the ASCII digits 0-9 only")
    return value


# On an integer query or path parameter: ``Annotated[int, Query(ge=...), ASCII_INT]``, in
# that order (before the Query, or nested, FastAPI publishes the bounds as ``ge``/``le``
# instead of ``minimum``/``maximum``, or enforces none).
ASCII_INT = BeforeValidator(_ascii_int)


def _json_value(what: str, root: str) -> AfterValidator:
    """A request's JSON value (a run's input, a message's payload) must survive being
    stored as UTF-8 text (no lone surrogates) and being read back: at most
    ``toren.core.contract.inputs.MAX_JSON_DEPTH`` levels of nesting, the host API's own rule and
    words (docs/http-api.md documents it; lowering it would be breaking)."""

    def check(value: Any) -> Any:
        try:
            check_depth(value, what, root)
        except InvalidInput as exc:
            raise ValueError(exc.message) from None
        work = [value]  # iterative, as check_depth: no RecursionError whatever the value
        while work:
            item = work.pop()
            if isinstance(item, str):
                _check_utf8(item)
            elif isinstance(item, dict):
                work.extend([*item.keys(), *item.values()])
            elif isinstance(item, list):
                work.extend(item)
        return value

    return AfterValidator(check)


def _check_utf8(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("strings must be valid Unicode (no lone surrogates)") from None


RunInput = Annotated[Any, _json_value("run input", "input")]
MessagePayload = Annotated[Any, _json_value("message payload", "payload")]
Name = Annotated[
    str,
    Field(
        pattern=NAME_PATTERN,
        description=f"An agent or process name: {NAME_HELP}.",
        examples=["support"],
    ),
]


class ErrorDetail(BaseModel):
    code: str = Field(description="A stable, machine-readable error code.")
    message: str = Field(description="What went wrong and what to do next.")
    details: Any = Field(default=None, description="Extra data (e.g. validation errors).")


class ErrorBody(BaseModel):
    """Every error response has this shape, whatever the status code."""

    error: ErrorDetail


class StartRunRequest(BaseModel):
    agent: Name
    process: Name = "main"
    input: RunInput = Field(default=None, description="Any JSON value; the agent's input.")
    idempotency_key: str | None = Field(
        default=None,
        pattern=KEY_PATTERN,
        description="The same key returns the same run (200 instead of 201); reusing it "
        "with another agent, process or input is a 409. Also accepted as the "
        "`Idempotency-Key` header. Visible ASCII, 1-255 characters.",
    )
    idempotencyKey: str | None = Field(  # the deprecated spelling itself
        default=None,
        pattern=KEY_PATTERN,
        description="Deprecated spelling of `idempotency_key`, accepted until 0.3.0; the "
        "response then carries `Deprecation: true` and a `Warning` header.",
        json_schema_extra={"deprecated": True},
    )
    concurrency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="A concurrency key for this run (a queue name, a tenant, a ticket): "
        "at most `concurrency_limit` runs of one key run or wait at once; the others "
        "stay queued. Overrides the agent's `concurrency:` key (docs/flow-control.md).",
    )
    concurrency_limit: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="The limit of `concurrency_key` (required with a key, unless the "
        "agent declares `concurrency:`).",
    )
    priority: int = Field(
        default=0,
        ge=-1_000_000,
        le=1_000_000,
        description="Within a concurrency key's queue, higher starts first; then FIFO.",
    )


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    cost_usd: str = Field(description="Decimal string, exact.")
    saved_by_replay_usd: str = Field(description="What replay did not pay again.")
    steps: int


class Lineage(BaseModel):
    run_id: str = Field(description="The source run.")
    at: str = Field(description="The fork point, `STREAM:POSITION` (e.g. `main:5`).")


class ScheduleOrigin(BaseModel):
    id: str = Field(description="The schedule that started the run, `agent/name`.")
    nominal: str | None = Field(description="The scheduled time it fired for (UTC, ISO 8601).")


class Concurrency(BaseModel):
    key: str = Field(description="The concurrency key the run counts against.")
    limit: int | None = Field(description="Runs of the key that may run or wait at once.")
    priority: int = Field(description="Its priority in the key's queue (higher first).")


class QueuePlace(BaseModel):
    key: str
    limit: int
    holding: int = Field(description="Runs of the key running or waiting now.")
    position: int = Field(description="1: the next of the key to start.")
    reason: str = Field(description="The same, in words.")


class RateLimitWait(BaseModel):
    key: str = Field(description="The provider rate limit, `provider:model`.")
    next_slot_at: float | None = Field(description="When its call's slot comes (Unix time).")
    reason: str = Field(description="`waiting: rate limit openai:gpt-4o-mini, next slot in 3 s`.")


class ValueSummary(BaseModel):
    """A value a list of runs leaves out because its JSON text is larger than
    ``SUMMARY_INLINE`` bytes (4096); ``GET /v1/runs/{run_id}`` has it whole."""

    bytes: int = Field(description="Size of the value's JSON text, in bytes.")
    preview: str = Field(description="The first 256 characters of that JSON text.")
    truncated: Literal[True] = True


class Run(BaseModel):
    id: str
    agent: str
    process: str
    status: RunStatus
    input: Any = None
    output: Any = None
    error: dict[str, Any] | None = None
    idempotency_key: str | None = None
    created_at: float = Field(description="Unix time, seconds.")
    updated_at: float
    waiting_for: list[str] | None = Field(
        default=None, description="Message names a waiting run is parked on."
    )
    not_before: float | None = Field(default=None, description="When a parked run wakes.")
    cancel_requested: bool
    usage: Usage
    code_version: str | None = None
    lease_recoveries: int
    invalidations: int
    retries: int = Field(default=0, description="How many times the run was retried.")
    tool_errors: int = Field(
        default=0,
        description="Tool calls that failed (recorded with an error). The built-in loop shows "
        "the model the error and goes on, unless the agent sets `on_tool_error: fail` "
        "(docs/agent-yaml.md). 0 on runs recorded before 0.2.",
    )
    forked_from: Lineage | None = Field(
        default=None, description="The run and step this run was forked from, if forked."
    )
    concurrency: Concurrency | None = Field(
        default=None, description="The run's concurrency key, limit and priority, if any."
    )
    queue: QueuePlace | None = Field(
        default=None,
        description="Why a queued run of a concurrency key waits, and its place (on a run's "
        "own endpoint; null otherwise).",
    )
    schedule: ScheduleOrigin | None = Field(
        default=None,
        description="The schedule and nominal time that started this run, if a schedule "
        "did (on a run's own endpoint; lists leave it null).",
    )
    rate_limit: RateLimitWait | None = Field(
        default=None,
        description="A waiting run parked for its next slot of a provider rate limit "
        "(docs/flow-control.md#provider-rate-limits; on a run's own endpoint; null "
        "otherwise).",
    )

    blocked: Blocked | None = Field(
        default=None,
        description="Set while the run's ticks fail on an infrastructure error (no API key, "
        "provider unreachable, database error, agent not deployed): what failed and when "
        "it is tried again. Null otherwise.",
    )
    lease: LeaseInfo | None = Field(
        default=None,
        description="The worker holding the run and until when its lease runs (a run "
        "held by a worker that is gone waits for this time). Null when no worker holds it.",
    )
    input_summary: ValueSummary | None = Field(
        default=None,
        description="In a list of runs, set when `input` was too large to list (it is then "
        "null); null otherwise.",
    )
    output_summary: ValueSummary | None = Field(
        default=None, description="As `input_summary`, for `output`."
    )
    error_summary: ValueSummary | None = Field(
        default=None, description="As `input_summary`, for `error`."
    )


class Blocked(BaseModel):
    error: dict[str, Any] = Field(description="`{type, code, message}` of the last failure.")
    attempts: int = Field(description="Failed ticks in a row.")
    since: float | None = Field(default=None, description="When the first of them failed.")
    retry_at: float | None = Field(default=None, description="When it is tried again.")


class LeaseInfo(BaseModel):
    worker: str
    expires_at: float | None = None


MAX_RETRY_STEPS = 1_000_000
MAX_RETRY_COST_USD = 1_000_000


class RetryRunRequest(BaseModel):
    """Both limits are optional: a retry may raise them for this run, never lower them
    (the agent's own limit wins when it is higher; an agent without the limit has none)."""

    # Strict: a JSON number only (``true`` or ``"5"`` is a 422, not 1 or 5).
    model_config = ConfigDict(strict=True)

    max_steps: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RETRY_STEPS,
        description=f"Raise limits.max_steps (an integer, 1 to {MAX_RETRY_STEPS:,}).",
    )
    max_cost_usd: float | None = Field(
        default=None,
        gt=0,
        le=MAX_RETRY_COST_USD,
        allow_inf_nan=False,
        description="Raise limits.max_cost_usd (a number of USD, more than 0 and at most "
        f"{MAX_RETRY_COST_USD:,}).",
    )

    @field_validator("max_steps", mode="before")
    @classmethod
    def _integral(cls, value: object) -> object:
        # JSON Schema's "integer" includes 428.0 (a number with no fraction): taken as 428.
        # Strict otherwise: true and "5" stay refused.
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value


def _fork_point(value: str) -> str:
    from toren.core.drivers.fixforward import parse_at

    try:
        parse_at(value)
    except InvalidInput as exc:
        raise ValueError(exc.message) from None
    return value


class ForkRunRequest(BaseModel):
    at: Annotated[str, AfterValidator(_fork_point)] = Field(
        max_length=300,
        # In the schema for clients and fuzzers; checked by _fork_point, whose message
        # says what a fork point is.
        json_schema_extra={"pattern": "^.+:[0-9]{1,9}$"},
        description="The fork point, `STREAM:POSITION`: the steps of that stream before "
        "the position (and everything they depend on) replay from the source run; the "
        "step at the position runs live.",
        examples=["main:2"],
    )
    input: RunInput = Field(
        default=None,
        description="The new run's input; the source run's input when the field is absent.",
    )


class RunList(BaseModel):
    runs: list[Run]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next (older) page; null on the last page."
    )


class Event(BaseModel):
    """One row of the event log (format v1, documented in docs/event-log.md)."""

    seq: int = Field(description="Physical sequence: increasing, the SSE event id.")
    run_id: str
    type: str
    stream: str
    position: int | None = None
    generation: int
    slot: str | None = Field(
        default=None,
        description="The event's unique key in its run (`{stream}#{generation}:{position}`, "
        "`:done`, `:inv`, `run:start`, `run:end`); null for events without one.",
    )
    digest: str | None = None
    code_version: str
    worker_id: str
    created_at: float
    format_version: int
    chain: str | None = Field(
        default=None,
        description="The event's link in its run's hash chain (docs/digest.md §7); null on "
        "events written before 0.2.",
    )
    payload: dict[str, Any]


class EventList(BaseModel):
    events: list[Event]
    next_after: int | None = Field(
        description="Pass as `after` for the next page; null when this page was not full "
        "(a page is also cut at 8 MiB of events)."
    )


class StreamDelta(BaseModel):
    """The data of an SSE ``delta`` message: model output of a call still in flight."""

    stream: str
    position: int | None
    text: str = Field(description="The next piece of text (redacted like everything else).")


class StreamReplayed(BaseModel):
    """The data of an SSE ``replayed`` message: a tick replayed this recorded step from
    the log (nothing was paid for it), while the stream was open."""

    stream: str
    position: int | None
    seq: int | None = Field(default=None, description="The seq of the replayed step's event.")


class StreamEnd(BaseModel):
    """The data of an SSE ``end`` message: the run as it ended."""

    run: Run | None


class SendMessageRequest(BaseModel):
    name: str = Field(
        pattern=MESSAGE_NAME_PATTERN,
        description="The name the run waits for (`ctx.wait_for_message(name)`).",
    )
    payload: MessagePayload = Field(default=None, description="Any JSON value.")


class MessageAccepted(BaseModel):
    run_id: str
    message_id: int
    waiting_for: list[str] | None = Field(
        default=None,
        description="The message names the run waits for now (null when it is not waiting).",
    )
    warning: str | None = Field(
        default=None,
        description="Set when the run waits for other names: the message is kept (a later "
        "`wait_for_message` of its name takes it) but does not wake the run.",
    )


class AgentInfo(BaseModel):
    name: str
    processes: list[str]
    error: str | None = Field(
        default=None, description="Why the agent cannot be loaded right now, if it cannot."
    )


class AgentList(BaseModel):
    agents: list[AgentInfo]


class Health(BaseModel):
    status: Literal["ok"]
    version: str


class Ready(BaseModel):
    status: Literal["ready"]


class RequestChange(BaseModel):
    """One part of a step request that differs between the recorded and the new request."""

    part: str = Field(
        description="`kind`, `provider`, `model`, `message`, `tool`, `param` (model calls), "
        "`argument` (tool calls), or a body field (`seconds`, `name`, `timeout`, `process`, "
        "`input`, `what`)."
    )
    text: str = Field(description="In words, e.g. `parameter temperature 0.2 -> 0.7`.")
    name: str | None = Field(description="The parameter, argument or tool; a message's role.")
    index: int | None = Field(description="The message's index in the request.")
    old: Any = Field(description="The recorded value (for a message: what happened to it).")
    new: Any = Field(description="The new value.")


class StreamFinding(BaseModel):
    """A stream the current code would invalidate."""

    stream: str
    from_pos: int = Field(description="The first step that would be re-run.")
    cause: Literal[
        InvalidationCause.DIGEST_MISMATCH,
        InvalidationCause.KIND_MISMATCH,
        InvalidationCause.STREAM_ENDED,
    ]
    expected_digest: str | None = Field(description="The digest recorded at from_pos.")
    actual_digest: str | None = Field(description="The digest the current code asks for.")
    expected_kind: str | None
    actual_kind: str | None
    written_by: list[str] = Field(description="Code versions that wrote the superseded steps.")
    suffix_steps: int
    suffix_model_calls: int
    suffix_tokens: int
    suffix_cost_usd: str = Field(description="Recorded cost of the suffix (decimal string).")
    changes: list[RequestChange] = Field(
        default_factory=list,
        description="Which parts of the request differ (empty for `stream_ended`).",
    )


class RunPlan(BaseModel):
    run_id: str
    agent: str
    process: str
    status: RunStatus
    code_version: str
    clean: bool = Field(description="Replays without any invalidation.")
    replayed_steps: int
    streams: list[str]
    findings: list[StreamFinding]
    problem: str | None = Field(description="Why the run cannot be planned (unknown agent...).")
    rerun_cost_usd: str


class PlanReport(BaseModel):
    plans: list[RunPlan]
    runs: int
    invalidated: int = Field(description="Runs with at least one stream to invalidate.")
    problems: int
    rerun_cost_usd: str = Field(description="Recorded cost of every suffix to re-run.")
    elapsed_ms: float
    more: bool = Field(
        default=False,
        description="More runs are in flight than `limit`: they were not planned.",
    )


class StepCheck(BaseModel):
    """The verdict on one recorded step's digest (see docs/digest.md)."""

    seq: int
    stream: str
    position: int
    generation: int
    kind: str | None
    event_type: str
    verdict: Literal["verified", "unverifiable", "mismatch"]
    recorded_digest: str | None
    derived_digest: str | None
    note: str | None = Field(
        description="Why it cannot be verified, what does not match, or how a 0.1 log was read."
    )
    response: Literal["verified", "mismatch", "not covered", "none"] = Field(
        default="none",
        description="The recorded answer, error and usage against the step's response "
        "digest (docs/digest.md §6): `not covered` when an earlier version recorded it, "
        "`none` for a step kind without one.",
    )
    response_note: str | None = None


class ResponseCounts(BaseModel):
    verified: int
    mismatch: int
    not_covered: int


class ChainBreakOut(BaseModel):
    seq: int
    stream: str
    position: int | None
    event_type: str
    note: str


class ChainOut(BaseModel):
    """The run's hash chain (docs/digest.md §7)."""

    linked: int = Field(description="Events whose chain re-derives.")
    not_covered: int = Field(description="Events written without a chain (an earlier version).")
    breaks: list[ChainBreakOut]
    head: str | None = Field(description="The last event's chain.")


class RunVerification(BaseModel):
    run_id: str
    ok: bool = Field(description="No mismatch of a request or a response, no break of the chain.")
    steps: int
    verified: int
    unverifiable: int
    mismatch: int
    responses: ResponseCounts
    chain: ChainOut
    checks: list[StepCheck]


class InvalidationExplained(BaseModel):
    seq: int = Field(description="The `StreamInvalidated` event.")
    stream: str
    from_pos: int
    cause: str
    changes: list[RequestChange]
    note: str | None = Field(description="Why there are no changes to show, if there are none.")


class InvalidationList(BaseModel):
    invalidations: list[InvalidationExplained]
