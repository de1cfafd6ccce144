"""The journal: the engine's whole replay decision, as a pure state machine over a run's
events. No asyncio, no clock, no store, no logging (compare Temporal's workflow
activation and Restate's VM): a driver feeds it what is in the log and what the code asks
for, and carries out what it answers.

**What the journal decides.** Folded from a run's events (:meth:`Journal.fold`, over the
views of :mod:`toren.core.contract.replay`), it answers every step request with one of:

- :class:`Replay`: the step at this position is recorded with this kind and digest (or is
  a pinned step of a forked run's copied history): answer from the log, free.
- :class:`Run`: nothing is recorded here; run the step live at ``generation``. The reuse
  claims travel with it, taken at request time so they follow call order: ``reuse`` is the
  superseded identical tool call whose result the n-th new call takes (n-th to n-th, a
  prompt edit never re-sends the email), ``continues`` the superseded child stream an
  identical spawn that moved continues.
- :class:`Supersede`: the recorded step differs (digest or kind). The stream's suffix from
  this position and, recursively, every child stream started in it are superseded: the
  journal has truncated its views, and ``invalidations`` are the ``StreamInvalidated``
  payloads to write, in order, before anything else of the run (the stream's own, then
  ``parent_invalidated`` for each descendant stream that holds steps). Then the step runs
  live, as ``run`` says.
- :class:`BackOff`: the storm guard. The suffix to supersede was written by a code version
  whose live workers started after this one's (a rolling deploy, or a rollback, in
  progress): the current deploy wins, so this version writes nothing and gives the run
  back. The journal is left unchanged.

:meth:`Journal.end_stream` answers the same question when code ends a stream before its
recorded end (cause ``stream_ended``). :meth:`Journal.recorded` folds in what the driver
stored; :meth:`Journal.usage_at` is the run's usage as the live run saw it at the point
the code has reached (replay-exact ``ctx.usage``); :meth:`Journal.redeliverable` is the
message a wait takes back from a superseded step.

**What the driver does** (the tick, :mod:`toren.core.drivers.tick`; the dry run,
:mod:`toren.core.drivers.plan`): it stamps events (run, slot, worker, code version, time), writes
them under the lease, executes live steps (:mod:`toren.core.drivers.effects`), parks, renews and
releases. The plan writes nothing: it reports each :class:`Supersede` as a finding.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from toren.core.contract.events import (
    Event,
    MessageReceived,
    ModelCallCutOff,
    ModelCallRecorded,
    RunForked,
    StreamInvalidated,
    ToolCallRecorded,
    ValueRecorded,
)
from toren.core.contract.replay import (
    RunLog,
    Step,
    StreamView,
    children_started_in,
    continued_child,
    descendants,
    invalidation_slot,
    redeliverable_message,
    reusable_tool,
)
from toren.core.contract.values import (
    ZERO,
    InvalidationCause,
    StepKind,
    Totals,
    recorded_nano,
)

# -- answers -----------------------------------------------------------------------------


class Replay(NamedTuple):
    """Answer from the log: ``step`` is recorded at this position with this request."""

    step: Step


class Run(NamedTuple):
    """Run the step live at ``generation``. ``reuse``: the superseded tool call whose
    result this call takes instead of calling the tool; ``continues``: the superseded
    child stream this spawn continues. Both are claimed already (no later request gets
    them)."""

    generation: int
    reuse: Step | None = None
    continues: str | None = None


@dataclass(frozen=True, slots=True)
class Invalidation:
    """One ``StreamInvalidated`` to write: its stream, the generation it ends, and the
    payload. The driver stamps it (run, worker, time) under :attr:`slot`."""

    stream: str
    generation: int
    payload: StreamInvalidated

    @property
    def slot(self) -> str:
        return invalidation_slot(self.stream, self.generation)


@dataclass(frozen=True, slots=True)
class Supersede:
    """The recorded suffix of ``stream`` from ``from_pos`` is superseded (see the module
    docstring). ``superseded``: the steps it takes out of the views, the stream's and its
    descendants' (what a plan reports and prices); ``run``: how the asking step runs live
    (None from :meth:`Journal.end_stream`: no step asked)."""

    stream: str
    from_pos: int
    cause: InvalidationCause
    expected: Step | None
    invalidations: tuple[Invalidation, ...]
    superseded: tuple[Step, ...]
    run: Run | None = None

    @property
    def payload(self) -> StreamInvalidated:
        """The stream's own ``StreamInvalidated`` (the first to write)."""
        return self.invalidations[0].payload


@dataclass(frozen=True, slots=True)
class BackOff:
    """The storm guard's verdict: ``newer_version`` wrote the suffix and its live workers
    started after this version's; give the run back and let it finish there."""

    newer_version: str
    stream: str
    from_pos: int


Answer = Replay | Run | Supersede | BackOff


@dataclass(frozen=True, slots=True)
class LiveVersions:
    """What the storm guard knows of the fleet: for each live code version, when its most
    recently started worker started (``newest_start_by_version``), and when this worker
    started (used when its own version is not listed yet). Empty: no guard."""

    newest_start: Mapping[str, float] = field(default_factory=dict)
    started_at: float = 0.0

    def newer_than(self, code_version: str, written_by: Iterable[str]) -> str | None:
        """The first of ``written_by`` whose live workers started after ``code_version``'s
        (None: this version may supersede them all). A version with no live worker
        never wins: nobody is left to finish the run under it."""
        if not self.newest_start:
            return None
        mine = self.newest_start.get(code_version)
        if mine is None:
            mine = self.started_at
        for version in sorted(set(written_by) - {code_version}):
            theirs = self.newest_start.get(version)
            if theirs is not None and theirs > mine:
                return version
        return None


NO_GUARD = LiveVersions()

# Live answers without a claim, made once per generation (a step path allocates none).
_PLAIN = [Run(generation) for generation in range(64)]


# -- usage, replay-exact -----------------------------------------------------------------


def _usage_of(event: Event) -> tuple[int, int, int, int] | None:
    """(input tokens, output tokens, cost nano-USD, steps) of an event that counts in the
    run's totals; None for any other event. A model call cut off in flight
    (``ModelCallCutOff``) counts what the provider billed for it, but is not a step."""
    payload = event.payload
    if isinstance(payload, ModelCallRecorded):
        return payload.input_tokens, payload.output_tokens, recorded_nano(payload.cost_usd), 1
    if isinstance(payload, (ToolCallRecorded, ValueRecorded)):
        return 0, 0, 0, 1
    if isinstance(payload, ModelCallCutOff):
        return payload.input_tokens, payload.output_tokens, recorded_nano(payload.cost_usd), 0
    return None


class UsageBySeq:
    """The run's usage as it stood after each event of the log (by seq): what a live run
    saw at a point of its code, so that replay can show the same. ``ctx.usage`` read
    during replay must not be the final total, or agent code deciding on it (a budget)
    would take another branch on replay than it took live. Cumulative (input, output,
    nano-USD, steps) tuples inside (one per step event, built at every tick's load);
    :class:`Totals` outside."""

    __slots__ = ("invalidations", "seqs", "totals")

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self.seqs: list[int] = []
        self.totals: list[tuple[int, int, int, int]] = []
        self.invalidations = 0
        for event in events:
            self.add(event)

    def add(self, event: Event) -> None:
        """Count one more event (its seq above every one counted so far)."""
        used = _usage_of(event)
        if used is not None:
            i, o, c, steps = self.totals[-1] if self.totals else (0, 0, 0, 0)
            self.seqs.append(event.seq)
            self.totals.append((i + used[0], o + used[1], c + used[2], steps + used[3]))
        elif isinstance(event.payload, StreamInvalidated):
            self.invalidations += 1

    def at(self, seq: int) -> Totals:
        """The totals after every event up to ``seq``."""
        n = bisect.bisect_right(self.seqs, seq)
        return _totals(self.totals[n - 1]) if n else ZERO

    def spent(self) -> Totals:
        """Everything counted (steps, tokens, money): what the run has spent."""
        return _totals(self.totals[-1]) if self.totals else ZERO

    def final(self) -> Totals:
        """The totals of the whole log, invalidations too (what the run row should hold)."""
        i, o, c, steps = self.totals[-1] if self.totals else (0, 0, 0, 0)
        return Totals(i, o, c, 0, steps, self.invalidations)


def _totals(t: tuple[int, int, int, int]) -> Totals:
    return Totals(input_tokens=t[0], output_tokens=t[1], cost_nanousd=t[2], steps=t[3])


def log_totals(events: Iterable[Event]) -> Totals:
    """What the run row's totals should be, from the log alone."""
    return UsageBySeq(events).final()


# -- the journal -------------------------------------------------------------------------


def _cause(expected: Step | None, kind: StepKind | None) -> InvalidationCause:
    if expected is None:
        return InvalidationCause.STREAM_ENDED
    if expected.kind != kind:
        return InvalidationCause.KIND_MISMATCH
    return InvalidationCause.DIGEST_MISMATCH


class Journal:
    """A run's journal: its fold (:attr:`log`), its usage by seq, and the highest seq the
    code has reached (a step replayed or an event recorded). See the module docstring."""

    __slots__ = ("log", "seen_seq", "usage")

    def __init__(self, run_id: str) -> None:
        self.log = RunLog(run_id)
        self.usage = UsageBySeq()
        # Not a replay flag: the replay phase ends at the first live step, while a
        # concurrent branch may still be replaying (and must see its own position).
        self.seen_seq = 0

    @classmethod
    def fold(cls, run_id: str, events: Sequence[Event]) -> Journal:
        journal = cls(run_id)
        journal.log = RunLog.fold(run_id, events)
        journal.usage = UsageBySeq(events)
        return journal

    # -- what the log says -----------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self.log.run_id

    @property
    def retries(self) -> int:
        """``RunRetried`` events folded: new step and end slots end in ``~retries``."""
        return self.log.retries

    @property
    def raised_limits(self) -> dict[str, Any]:
        return self.log.raised_limits

    @property
    def forked(self) -> RunForked | None:
        return self.log.forked

    @property
    def terminal(self) -> Event | None:
        return self.log.terminal

    @property
    def streams(self) -> Mapping[str, StreamView]:
        return self.log.streams

    def usage_at(self) -> Totals:
        """The run's usage as the live run saw it at the point the code has reached."""
        return self.usage.at(self.seen_seq)

    def spent(self) -> Totals:
        """Everything the log records as spent (the budget's measure)."""
        return self.usage.spent()

    # -- requests --------------------------------------------------------------------------

    def request(
        self,
        stream: str,
        pos: int,
        kind: StepKind,
        digest: str,
        *,
        code_version: str,
        live_versions: LiveVersions = NO_GUARD,
        reusable: bool = True,
    ) -> Answer:
        """What the step ``kind`` at ``stream``:``pos`` with ``digest`` does. Taken when the
        code calls the step (not when it is awaited), so answers follow call order.
        ``reusable``: a live tool call may take a superseded identical call's result (False
        for tools declared free of side effects, or ``reexecute``)."""
        log = self.log
        view = log.streams.get(stream) or log.stream(stream)
        step = view.steps.get(pos)
        if step is None:
            return self._run(view, pos, kind, digest, reusable)
        if step.kind == kind and (step.digest == digest or pos < view.pinned):
            seq = (step.done or step.first).seq
            if seq > self.seen_seq:
                self.seen_seq = seq
            return Replay(step)
        found = self._supersede(view, pos, step, kind, digest, code_version, live_versions)
        if isinstance(found, BackOff):
            return found
        run = self._run(view, pos, kind, digest, reusable)
        return Supersede(
            found.stream,
            found.from_pos,
            found.cause,
            found.expected,
            found.invalidations,
            found.superseded,
            run,
        )

    def end_stream(
        self,
        stream: str,
        positions_taken: int,
        *,
        code_version: str,
        live_versions: LiveVersions = NO_GUARD,
    ) -> Supersede | BackOff | None:
        """The code ended ``stream`` after ``positions_taken`` steps: the recorded steps
        past that are superseded (cause ``stream_ended``). None when nothing is past it."""
        view = self.log.streams.get(stream)
        if view is None or view.length <= positions_taken:
            return None
        return self._supersede(view, positions_taken, None, None, None, code_version, live_versions)

    def _run(self, view: StreamView, pos: int, kind: StepKind, digest: str, reusable: bool) -> Run:
        if kind == StepKind.TOOL and reusable:
            reuse = reusable_tool(self.log, view.name, digest)
            if reuse is not None:
                self.log.reused_seqs.add(reuse.first.seq)  # claimed now, in call order
                return Run(view.generation, reuse=reuse)
        elif kind == StepKind.CHILD:
            continues = continued_child(self.log, view.name, digest)
            if continues is not None:
                self.log.continues[f"{view.name}/{pos}"] = continues
                return Run(view.generation, continues=continues)
        generation = view.generation
        return _PLAIN[generation] if generation < 64 else Run(generation)

    def _supersede(
        self,
        view: StreamView,
        from_pos: int,
        expected: Step | None,
        kind: StepKind | None,
        digest: str | None,
        code_version: str,
        live_versions: LiveVersions,
    ) -> Supersede | BackOff:
        log = self.log
        suffix = [s for p, s in sorted(view.steps.items()) if p >= from_pos]
        children = descendants(log, children_started_in(suffix))
        below = [(name, list(log.stream(name).steps.values())) for name in children]
        written = [s.code_version for s in suffix]
        written += [s.code_version for _, steps in below for s in steps]
        newer = live_versions.newer_than(code_version, written)
        if newer is not None:
            return BackOff(newer, view.name, from_pos)
        cause = _cause(expected, kind)
        invalidations = [
            Invalidation(
                view.name,
                view.generation,
                StreamInvalidated(
                    from_pos=from_pos,
                    expected_digest=expected.digest if expected else None,
                    actual_digest=digest,
                    # The log's spelling (plain strings): the enum members equal them.
                    expected_kind=str(expected.kind) if expected else None,
                    actual_kind=str(kind) if kind is not None else None,
                    code_version=code_version,
                    cause=cause.value,
                ),
            )
        ]
        view.truncate(from_pos)
        superseded = list(suffix)
        for name, steps in below:
            superseded.extend(steps)
            child = log.streams[name]
            if not steps:
                continue
            invalidations.append(
                Invalidation(
                    name,
                    child.generation,
                    StreamInvalidated(
                        from_pos=0,
                        code_version=code_version,
                        cause=InvalidationCause.PARENT_INVALIDATED.value,
                    ),
                )
            )
            child.truncate(0)
        return Supersede(
            view.name, from_pos, cause, expected, tuple(invalidations), tuple(superseded)
        )

    # -- what the driver stored --------------------------------------------------------------

    def recorded(self, events: Iterable[Event]) -> None:
        """Fold in events the driver stored (with their seqs). A ``StreamInvalidated`` the
        journal answered with is counted, not applied again: its views were truncated
        when :meth:`request` or :meth:`end_stream` answered."""
        log = self.log
        usage = self.usage
        for event in events:
            if isinstance(event.payload, StreamInvalidated):
                # Not the code's position either: a branch still replaying must not see
                # the usage of steps recorded after its own.
                usage.invalidations += 1
                log.last_seq = max(log.last_seq, event.seq)
                continue
            log.apply(event)
            usage.add(event)
            if event.seq > self.seen_seq:
                self.seen_seq = event.seq

    def redeliverable(self, name: str) -> MessageReceived | None:
        """The oldest message named ``name`` that only superseded steps received: it goes
        back in line for the next wait on its name (see ``replay.redeliverable_message``).
        Asked when a wait takes a message (it may have parked since its request); claimed
        when the driver records the ``MessageReceived``."""
        return redeliverable_message(self.log, name)
