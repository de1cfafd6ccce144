"""The event log, format v1.

Every row of the ``events`` table is one :class:`Event`: an envelope (run, stream,
position, physical sequence, digest, code version, worker, time, format version) around a
JSON payload whose shape depends on ``type``. The log is append-only: nothing in it is
ever updated or deleted. ``docs/event-log.md`` documents the format for other readers.

Forward compatibility: readers ignore payload fields they do not know and keep events of
types they do not know as :class:`UnknownEvent` (skipped by the fold). A newer minor may
add fields and types; it may not change the meaning of an existing one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from toren.core.contract.jsontext import dumps, loads
from toren.core.contract.values import InvalidationCause, StepKind
from toren.errors import CorruptEventLog

FORMAT_VERSION = 1
ROOT = ""  # the stream of run-level events (RunStarted, RunWaiting, RunCompleted, ...)


@dataclass(frozen=True)
class Payload:
    """Base of typed payloads. ``TYPE`` is the event's type name in the log."""

    TYPE: ClassVar[str] = ""
    # Fields a later release added that are left out of the stored payload while None: an
    # event that does not use them keeps the exact bytes an earlier release wrote.
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)  # the dataclass fields (ClassVars live on the class)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Payload:
        """Read a stored payload; fields a newer release added are ignored. Built without
        the dataclass ``__init__`` (a frozen init costs a ``setattr`` per field): replay
        reads every event of a run at the start of every tick."""
        plain, factories = _defaults(cls)
        obj = object.__new__(cls)
        values = obj.__dict__
        values.update(plain)
        for name, factory in factories:
            if name not in data:
                values[name] = factory()
        known = cls.__dataclass_fields__
        if known.keys() >= data.keys():
            values.update(data)
        else:  # written by a newer release: keep the fields this one knows
            for key, value in data.items():
                if key in known:
                    values[key] = value
        return obj


_DEFAULTS: dict[type, tuple[dict[str, Any], list[tuple[str, Any]]]] = {}


def _defaults(cls: type) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    found = _DEFAULTS.get(cls)
    if found is None:
        plain = {f.name: f.default for f in fields(cls) if f.default is not MISSING}
        factories = [
            (f.name, f.default_factory) for f in fields(cls) if f.default_factory is not MISSING
        ]
        found = _DEFAULTS[cls] = (plain, factories)
    return found


@dataclass(frozen=True)
class RunStarted(Payload):
    TYPE: ClassVar[str] = "RunStarted"
    agent: str = ""
    process: str = "main"
    input: object = None
    # A scheduled run's origin, {"id": ..., "nominal": "2026-12-04T09:00:00Z"}; absent
    # (None, and not written) for other runs and in logs written before 0.2.
    schedule: dict[str, Any] | None = None
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"schedule"})


@dataclass(frozen=True)
class ModelCallRecorded(Payload):
    """A finished model call. The request's messages are stored by reference:
    ``message_list`` is the content address of a list node in ``blobs`` (the previous
    list of the conversation plus the new message hashes), so a conversation's history
    is stored once. ``tools`` are tool-spec content addresses. The response is stored
    inline. Exactly one of response/error is set."""

    TYPE: ClassVar[str] = "ModelCallRecorded"
    provider: str = ""
    model: str = ""
    message_list: str | None = None
    message_count: int = 0
    tools: list[str] = field(default_factory=list)
    params: dict[str, object] = field(default_factory=dict)
    response: dict[str, object] | None = None
    error: dict[str, Any] | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: str = "0"
    latency_ms: float = 0.0
    # Since 0.2: the digest of the response, error and usage above (docs/digest.md §6),
    # which ``toren runs verify`` checks. None in events written before.
    response_digest: str | None = None


@dataclass(frozen=True)
class ModelCallCutOff(Payload):
    """A model call cut off in flight (a drain window that ran out) after the provider had
    reported usage for it: what it billed, counted in the run's totals. A run-level event
    (root stream, no position, no digest), so it never occupies the step's place: the step
    has no ``ModelCallRecorded`` and runs again. ``stream``, ``position`` and
    ``request_digest`` name the step it was. Since 0.1 (a reader that does not know the
    type skips it, and then counts the run's cost without it)."""

    TYPE: ClassVar[str] = "ModelCallCutOff"
    stream: str = ""
    position: int = 0
    request_digest: str = ""
    provider: str = ""
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: str = "0"
    latency_ms: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class ToolCallRecorded(Payload):
    TYPE: ClassVar[str] = "ToolCallRecorded"
    name: str = ""
    args: dict[str, object] = field(default_factory=dict)
    result: object = None
    error: dict[str, Any] | None = None
    latency_ms: float = 0.0
    reused_from_seq: int | None = None  # set when a superseded identical call was reused
    # Since 0.2: the digest of the result and error above (docs/digest.md §6). None in
    # events written before.
    response_digest: str | None = None


@dataclass(frozen=True)
class ValueRecorded(Payload):
    TYPE: ClassVar[str] = "ValueRecorded"
    what: str = ""  # "now" | "random" | "uuid"
    value: object = None


@dataclass(frozen=True)
class TimerScheduled(Payload):
    TYPE: ClassVar[str] = "TimerScheduled"
    fire_at: float = 0.0
    seconds: float = 0.0
    # StepKind.SLEEP, or StepKind.MESSAGE for the timeout of a wait_for_message; as the
    # log spells it (a plain string).
    purpose: str = StepKind.SLEEP.value
    # Since 0.2, so that every digested input is in the log (a 0.1 reader ignores them):
    # the duration exactly as the code gave it (``sleep(1)`` is digested over the integer
    # 1, ``sleep(1.0)`` over the float 1.0; ``seconds`` is always a float), and for a
    # message wait the name waited for. None in logs written before 0.2.
    requested_seconds: int | float | None = None
    message: str | None = None


@dataclass(frozen=True)
class TimerFired(Payload):
    TYPE: ClassVar[str] = "TimerFired"
    fired_at: float = 0.0


@dataclass(frozen=True)
class MessageReceived(Payload):
    TYPE: ClassVar[str] = "MessageReceived"
    name: str = ""
    payload: object = None
    inbox_id: int | None = None


@dataclass(frozen=True)
class ChildStarted(Payload):
    TYPE: ClassVar[str] = "ChildStarted"
    process: str = ""
    input: object = None
    child_stream: str = ""
    # Set when this child replaces an identical spawn superseded by an invalidation (the
    # spawn moved to another position): the superseded child stream it continues, whose
    # identical tool calls it reuses rather than performing them again.
    continues: str | None = None


@dataclass(frozen=True)
class ChildCompleted(Payload):
    TYPE: ClassVar[str] = "ChildCompleted"
    output: object = None
    error: dict[str, object] | None = None


@dataclass(frozen=True)
class StreamInvalidated(Payload):
    """The stream's view is truncated at ``from_pos``: steps from there on are superseded
    (kept in the log, no longer replayed). ``actual_digest`` is None when the new code
    ended the stream before ``from_pos``."""

    TYPE: ClassVar[str] = "StreamInvalidated"
    from_pos: int = 0
    expected_digest: str | None = None
    actual_digest: str | None = None
    expected_kind: str | None = None
    actual_kind: str | None = None
    code_version: str = ""
    cause: str = InvalidationCause.DIGEST_MISMATCH.value  # an InvalidationCause, as spelled


@dataclass(frozen=True)
class RunWaiting(Payload):
    TYPE: ClassVar[str] = "RunWaiting"
    not_before: float | None = None
    messages: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunCompleted(Payload):
    TYPE: ClassVar[str] = "RunCompleted"
    output: Any = None


@dataclass(frozen=True)
class RunFailed(Payload):
    TYPE: ClassVar[str] = "RunFailed"
    error: dict[str, object] = field(default_factory=dict)
    # The seqs of the recorded step failures that ended the run (the failed step, and for
    # a failed child the child's failed step too): what a retry runs again. Empty when
    # the run ended in agent code or on a limit, with no failed step behind it.
    failed_seqs: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RunRetried(Payload):
    """A failed run continues under the code now deployed (``toren runs retry``). Folding
    it makes the run unfinished again and takes the failures in ``retried_seqs`` out of
    their streams' views, so those steps run again live; every other step replays. Limits
    in ``raise_limits`` (``max_steps``, ``max_cost_usd``) apply to this run from now on,
    never below the deployed agent's own."""

    TYPE: ClassVar[str] = "RunRetried"
    attempt: int = 1
    failed_seq: int | None = None  # the RunFailed this retry answers
    error: dict[str, object] | None = None  # its error, for the record
    retried_seqs: list[int] = field(default_factory=list)
    raise_limits: dict[str, Any] = field(default_factory=dict)
    code_version: str = ""


@dataclass(frozen=True)
class RunForked(Payload):
    """This run was forked from ``source_run`` at ``stream``:``position``. The source's
    steps before that point were copied into this log (generation 0, fresh slots); they
    replay whatever the digest the current code asks for, as the history the fork starts
    from: ``pins`` maps each copied stream to the number of leading positions pinned."""

    TYPE: ClassVar[str] = "RunForked"
    source_run: str = ""
    stream: str = ""
    position: int = 0
    source_seq: int = 0  # the source log's last seq when it was copied
    pins: dict[str, int] = field(default_factory=dict)
    input_changed: bool = False


@dataclass(frozen=True)
class RunCancelled(Payload):
    TYPE: ClassVar[str] = "RunCancelled"
    reason: str = ""


@dataclass(frozen=True)
class UnknownEvent(Payload):
    """An event of a type this release does not know. Kept, never interpreted."""

    TYPE: ClassVar[str] = "?"
    raw: dict[str, object] = field(default_factory=dict)


EVENT_TYPES: dict[str, type[Payload]] = {
    cls.TYPE: cls
    for cls in (
        RunStarted,
        ModelCallRecorded,
        ToolCallRecorded,
        ValueRecorded,
        TimerScheduled,
        TimerFired,
        MessageReceived,
        ChildStarted,
        ChildCompleted,
        StreamInvalidated,
        RunWaiting,
        RunCompleted,
        RunFailed,
        RunCancelled,
        RunRetried,
        RunForked,
        ModelCallCutOff,
    )
}
TERMINAL_TYPES = frozenset({"RunCompleted", "RunFailed", "RunCancelled"})


@dataclass(frozen=True)
class Event:
    """One row of the log. ``seq`` is the physical sequence (0 until stored)."""

    run_id: str
    type: str
    payload: Payload
    stream: str = ROOT
    position: int | None = None
    generation: int = 0
    slot: str | None = None
    digest: str | None = None
    code_version: str = ""
    worker_id: str = ""
    created_at: float = 0.0
    format_version: int = FORMAT_VERSION
    seq: int = 0
    # Since 0.2: the hash chaining this event to the run's previous one (docs/digest.md
    # §7, toren.core.contract.audit). None in events written before, and until the writer sets it.
    chain: str | None = None

    def payload_json(self) -> str:
        text = self.__dict__.get("_payload_text")  # computed once by audit.chain
        if text is not None:
            return str(text)
        payload = self.payload
        if isinstance(payload, UnknownEvent):
            return dumps(payload.raw)
        # The fields themselves (what to_dict copies): dumps only reads them.
        fields = payload.__dict__
        omit = payload.OMIT_NONE
        if omit:
            fields = {k: v for k, v in fields.items() if v is not None or k not in omit}
        return dumps(fields)

    def to_dict(self) -> dict[str, object]:
        """The public JSON shape of an event (HTTP API, ``toren runs events --json``)."""
        return {
            "seq": self.seq,
            "run_id": self.run_id,
            "type": self.type,
            "stream": self.stream,
            "position": self.position,
            "generation": self.generation,
            "slot": self.slot,
            "digest": self.digest,
            "code_version": self.code_version,
            "worker_id": self.worker_id,
            "created_at": self.created_at,
            "format_version": self.format_version,
            "chain": self.chain,
            "payload": json.loads(self.payload_json()),
        }


def make_event(run_id: str, payload: Payload, **envelope: Any) -> Event:
    """A new event (seq 0 until stored), built without the frozen ``__init__``: every live
    step makes one."""
    if not _ENVELOPE.issuperset(envelope):  # seq, or a field Event lacks: __init__ decides
        return Event(run_id=run_id, type=payload.TYPE, payload=payload, **envelope)
    event = object.__new__(Event)
    values = event.__dict__
    values.update(_EVENT_DEFAULTS)  # seq stays 0 until stored
    values.update(envelope)
    values["run_id"] = run_id
    values["type"] = payload.TYPE
    values["payload"] = payload
    return event


_EVENT_DEFAULTS = _defaults(Event)[0]
# What a new event's envelope may set: the fields with defaults, but seq (set when stored).
_ENVELOPE = frozenset(_EVENT_DEFAULTS) - {"seq"}


def parse_payload(event_type: str, text: str, *, run_id: str, seq: int) -> Payload:
    """Parse a stored payload. Unknown fields and types are tolerated; unreadable data is
    a :class:`CorruptEventLog` naming the run and the event, never silently skipped."""
    try:
        data = loads(text)
    except (TypeError, ValueError) as exc:
        raise CorruptEventLog(
            f"event seq={seq} of run {run_id!r} ({event_type}) has a payload that is not "
            f"valid JSON ({exc}); the run cannot be replayed until the row is repaired",
            run_id=run_id,
            seq=seq,
        ) from None
    if not isinstance(data, dict):
        raise CorruptEventLog(
            f"event seq={seq} of run {run_id!r} ({event_type}) has a payload of type "
            f"{type(data).__name__}; expected a JSON object",
            run_id=run_id,
            seq=seq,
        )
    cls = EVENT_TYPES.get(event_type)
    if cls is None:
        return UnknownEvent(raw=data)
    try:
        return cls.from_dict(data)
    except (TypeError, ValueError) as exc:  # pragma: no cover - from_dict is lenient
        raise CorruptEventLog(
            f"event seq={seq} of run {run_id!r} ({event_type}) cannot be read: {exc}",
            run_id=run_id,
            seq=seq,
        ) from None
