"""The fold under the journal: a run's log folded into stream views, the step slots, and
the reuse rules (n-th to n-th tool reuse, continued children, redelivered messages). No
I/O happens here. :mod:`toren.core.contract.journal` builds the engine's whole decision on it
(what an invalidation writes, the storm guard, the claims); ``decide`` below is the bare
kernel of that decision, kept for readers of the fold alone.

A stream's *view* is the fold of its events in order, where ``StreamInvalidated``
truncates the view at ``from_pos``. The log stays append-only; the truncated steps move to
the stream's *superseded* list, from which identical tool calls may be reused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from toren.core.contract.events import (
    ROOT,
    TERMINAL_TYPES,
    ChildStarted,
    Event,
    MessageReceived,
    RunForked,
    RunRetried,
    RunStarted,
    StreamInvalidated,
    TimerScheduled,
    ToolCallRecorded,
)
from toren.core.contract.values import StepKind, retry_limits

# The step kind each event type belongs to. Kinds are part of the digest too; the kind
# check catches a step replaced by a different kind of step at the same position.
STEP_KIND: dict[str, StepKind | None] = {
    "ModelCallRecorded": StepKind.MODEL,
    "ToolCallRecorded": StepKind.TOOL,
    "ValueRecorded": StepKind.VALUE,
    "ChildStarted": StepKind.CHILD,
    "ChildCompleted": StepKind.CHILD,
    "MessageReceived": StepKind.MESSAGE,
    "TimerFired": None,  # completion of a sleep or a message wait: kind from its start
}


_ONE_PHASE = frozenset(
    {"ModelCallRecorded", "ToolCallRecorded", "ValueRecorded", "MessageReceived"}
)


def step_slot(
    stream: str, generation: int, position: int, done: bool = False, attempt: int = 0
) -> str:
    """The unique key of a step event: a second writer of the same slot is a conflict.
    After the n-th retry (``RunRetried``) the key ends in ``~n``: a retried step writes
    again at a position whose failure is still in the log."""
    slot = f"{stream}#{generation}:{position}" + (":done" if done else "")
    return f"{slot}~{attempt}" if attempt else slot


def end_slot(attempt: int = 0) -> str:
    """The unique key of a run's terminal event (``~n`` after the n-th retry)."""
    return f"run:end~{attempt}" if attempt else "run:end"


def invalidation_slot(stream: str, generation: int) -> str:
    return f"{stream}#{generation}:inv"


@dataclass
class Step:
    """A recorded step: its first event and, for two-phase steps (timers, message waits,
    children), its completion event."""

    position: int
    kind: StepKind
    digest: str
    first: Event
    done: Event | None = None

    @property
    def complete(self) -> bool:
        """One-phase steps are complete when recorded; a timer, a message wait with a
        timeout or a child needs its completion event too."""
        return self.done is not None or self.first.type in _ONE_PHASE

    @property
    def code_version(self) -> str:
        return (self.done or self.first).code_version


@dataclass
class StreamView:
    name: str
    generation: int = 0
    steps: dict[int, Step] = field(default_factory=dict)
    superseded: list[Step] = field(default_factory=list)
    invalidations: int = 0
    # Leading positions that replay whatever digest the code asks for (the history a
    # forked run starts from: see ``RunForked``); a different kind still invalidates.
    pinned: int = 0

    def apply(self, event: Event) -> None:
        if event.type == "StreamInvalidated":
            payload = event.payload
            assert isinstance(payload, StreamInvalidated)
            self.truncate(payload.from_pos)
            self.invalidations += 1
            return
        pos = event.position
        if pos is None or event.digest is None:
            return
        step = self.steps.get(pos)
        if step is None or step.digest != event.digest:
            self.steps[pos] = Step(pos, _kind_of(event), event.digest, event)
        else:
            step.done = event

    def truncate(self, from_pos: int) -> list[Step]:
        """Drop steps at positions >= from_pos from the view (they stay in the log)."""
        removed = [self.steps.pop(p) for p in sorted(p for p in self.steps if p >= from_pos)]
        self.superseded.extend(removed)
        self.generation += 1
        self.pinned = min(self.pinned, from_pos)
        return removed

    def retry(self, seqs: set[int]) -> None:
        """A retry (``RunRetried``): a one-phase step whose recorded failure is in ``seqs``
        leaves the view (its position runs again live); a child whose failed completion
        is in ``seqs`` is open again (its stream resumes, replaying what it recorded)."""
        for pos, step in list(self.steps.items()):
            if step.first.seq in seqs and step.first.type in _ONE_PHASE:
                del self.steps[pos]
            elif step.done is not None and step.done.seq in seqs:
                step.done = None

    @property
    def length(self) -> int:
        return max(self.steps) + 1 if self.steps else 0


def _kind_of(event: Event) -> StepKind:
    if event.type == "TimerScheduled":
        payload = event.payload
        assert isinstance(payload, TimerScheduled)
        return StepKind.SLEEP if payload.purpose == StepKind.SLEEP else StepKind.MESSAGE
    return STEP_KIND.get(event.type) or StepKind.UNKNOWN


@dataclass
class RunLog:
    """The fold of a whole run's events."""

    run_id: str
    streams: dict[str, StreamView] = field(default_factory=dict)
    started: RunStarted | None = None
    terminal: Event | None = None
    reused_seqs: set[int] = field(default_factory=set)
    # A child stream that replaces a superseded identical spawn -> the stream it continues.
    continues: dict[str, str] = field(default_factory=dict)
    last_seq: int = 0
    retries: int = 0  # RunRetried events folded: new step slots end in ``~retries``
    # Limits raised by retries (``max_steps``, ``max_cost_nanousd``): the highest asked for.
    raised_limits: dict[str, int] = field(default_factory=dict)
    forked: RunForked | None = None

    def stream(self, name: str) -> StreamView:
        view = self.streams.get(name)
        if view is None:
            view = self.streams[name] = StreamView(name)
        return view

    def apply(self, event: Event) -> None:
        self.last_seq = max(self.last_seq, event.seq)
        if event.stream == ROOT:
            if isinstance(event.payload, RunStarted):
                self.started = event.payload
            elif event.type in TERMINAL_TYPES:
                self.terminal = event
            elif isinstance(event.payload, RunRetried):
                self._retry(event.payload)
            elif isinstance(event.payload, RunForked):
                self.forked = event.payload
                for name, pinned in event.payload.pins.items():
                    self.stream(name).pinned = pinned
            return
        payload = event.payload
        if isinstance(payload, ToolCallRecorded) and payload.reused_from_seq:
            self.reused_seqs.add(payload.reused_from_seq)
        elif isinstance(payload, ChildStarted) and payload.continues:
            self.continues[payload.child_stream] = payload.continues
        self.stream(event.stream).apply(event)

    def _retry(self, retried: RunRetried) -> None:
        self.terminal = None
        self.retries += 1
        seqs = set(retried.retried_seqs)
        for view in self.streams.values():
            view.retry(seqs)
        for name, value in retry_limits(retried.raise_limits).items():
            self.raised_limits[name] = max(value, self.raised_limits.get(name, value))

    @classmethod
    def fold(cls, run_id: str, events: Iterable[Event]) -> RunLog:
        log = cls(run_id)
        for event in events:
            log.apply(event)
        return log


# -- decisions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    step: Step


@dataclass(frozen=True)
class Live:
    pass


@dataclass(frozen=True)
class Invalidate:
    """Truncate ``stream`` at ``from_pos`` and run live from there (the journal's
    ``Supersede`` adds what to write, for the stream and its descendant streams)."""

    stream: str
    from_pos: int
    expected: Step
    actual_kind: StepKind
    actual_digest: str


Decision = Replay | Live | Invalidate


_LIVE = Live()


def decide(view: StreamView, position: int, kind: StepKind, digest: str) -> Decision:
    """What a step request at ``position`` does, given the stream's current view."""
    step = view.steps.get(position)
    if step is None:
        return _LIVE
    if step.kind == kind and (step.digest == digest or position < view.pinned):
        return Replay(step)
    return Invalidate(view.name, position, step, kind, digest)


def children_started_in(steps: Iterable[Step]) -> list[str]:
    """The child streams started by these steps (to be invalidated with their parent)."""
    names = []
    for step in steps:
        if isinstance(step.first.payload, ChildStarted):
            names.append(step.first.payload.child_stream)
    return names


def descendants(log: RunLog, streams: Iterable[str]) -> list[str]:
    """The given streams and, recursively, every child stream they started in their view."""
    out: list[str] = []
    todo = list(streams)
    while todo:
        name = todo.pop(0)
        if name in out:
            continue
        out.append(name)
        view = log.streams.get(name)
        if view is not None:
            todo.extend(children_started_in(view.steps.values()))
    return out


def lineage(log: RunLog, stream: str) -> list[str]:
    """``stream`` and the superseded child streams it continues, nearest first: a spawn
    that moved to another position runs under a new stream name, yet continues the old."""
    out = [stream]
    while (older := log.continues.get(out[-1])) is not None and older not in out:
        out.append(older)
    return out


def superseded_pool(log: RunLog, stream: str) -> list[Step]:
    """The superseded steps a new step of ``stream`` may reuse: its own stream's and those
    of the superseded child streams it continues."""
    pool: list[Step] = []
    for name in lineage(log, stream):
        view = log.streams.get(name)
        if view is not None:
            pool.extend(view.superseded)
    return pool


def reusable_tool(log: RunLog, stream: str, digest: str) -> Step | None:
    """After an invalidation, the n-th new call of an identical tool request reuses the
    n-th superseded one: a prompt edit must never re-send the email, nor must a spawn that
    moved to another position. Failed calls are not reused (re-trying them is what the
    user would expect)."""
    for step in superseded_pool(log, stream):
        if step.kind != StepKind.TOOL or step.digest != digest:
            continue
        payload = step.first.payload
        if not isinstance(payload, ToolCallRecorded) or payload.error is not None:
            continue
        if step.first.seq in log.reused_seqs:
            continue
        return step
    return None


def continued_child(log: RunLog, stream: str, digest: str) -> str | None:
    """The superseded child stream a new identical spawn in ``stream`` continues (n-th new
    spawn to n-th superseded one), so that its tool calls are not performed twice."""
    taken = set(log.continues.values())
    for step in superseded_pool(log, stream):
        payload = step.first.payload
        if (
            step.kind != StepKind.CHILD
            or step.digest != digest
            or not isinstance(payload, ChildStarted)
        ):
            continue
        if payload.child_stream not in taken:
            return payload.child_stream
    return None


def received_message(step: Step) -> MessageReceived | None:
    """The message a message-wait step received (None: it timed out or is still waiting)."""
    for event in (step.done, step.first):
        if event is not None and isinstance(event.payload, MessageReceived):
            return event.payload
    return None


def redeliverable_message(log: RunLog, name: str) -> MessageReceived | None:
    """The oldest message named ``name`` that only superseded steps received. A message
    belongs to the run, not to the step that consumed it: when an invalidation supersedes
    that step, the message goes back in line, first in its original order, for the next
    wait on its name in any stream (the inbox row stays consumed; the log says who holds
    it)."""
    candidates: dict[int, MessageReceived] = {}
    for view in log.streams.values():
        for step in view.superseded:
            if step.kind != StepKind.MESSAGE:
                continue
            message = received_message(step)
            if message is not None and message.name == name and message.inbox_id is not None:
                candidates[message.inbox_id] = message
    if not candidates:
        return None
    for view in log.streams.values():
        for step in view.steps.values():
            if step.kind == StepKind.MESSAGE and (message := received_message(step)) is not None:
                candidates.pop(message.inbox_id or -1, None)
    return candidates[min(candidates)] if candidates else None
