"""Verify a run's digests: re-derive every recorded step's request digest from its stored
events and blobs (the rules of ``docs/digest.md``) and compare it with the digest the step
recorded. This is what an auditor, or a billing dispute, runs: ``toren runs verify``, or
:func:`verify_run` from Python.

Each step gets one verdict:

* ``verified``: the digest re-derives byte for byte from what the log records;
* ``unverifiable``: the log does not hold everything the digest covers (a missing blob, an
  event type this release does not know, a 0.1 timed wait whose name was never written);
  ``note`` says why;
* ``mismatch``: the log holds everything, and it does not hash to the recorded digest (or
  a stored blob does not hash to its address): the log was altered, or the digest was not
  made by these rules. ``note`` says what, and the step's seq, stream and position say
  where.

Since 0.2 each step also gets a verdict on its **response** (``response``): ``verified``
(the recorded answer, error, token counts and cost hash to the step's response digest),
``mismatch`` (they do not: altered after the fact), ``not covered`` (recorded by an
earlier version, which wrote no response digest) or ``none`` (a step kind with no
response digest: a timer, a value, a message; the chain covers them). And the run's log
gets a verdict on its **chain** (:class:`ChainReport`): every event written since 0.2
links to the one before it, so an event deleted, moved or altered is a ``break`` at the
event after it (or at itself). See docs/digest.md §6 and §7.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from toren.core.contract.audit import RESPONSE_FIELDS, chain_hash, response_digest
from toren.core.contract.digest import request_digest
from toren.core.contract.events import Event
from toren.core.contract.ports import RunStore
from toren.core.contract.recorded import RecordedStep, derive, group_steps, load_blobs, waited_names
from toren.core.contract.values import StepKind
from toren.errors import InvalidInput, RunNotFound

Verdict = Literal["verified", "unverifiable", "mismatch"]
ResponseVerdict = Literal["verified", "mismatch", "not covered", "none"]
EARLIER = "recorded by an earlier version"


@dataclass(frozen=True)
class StepCheck:
    """The verdict on one step (or on one completion event of a step)."""

    seq: int
    stream: str
    position: int
    generation: int
    kind: StepKind | None
    event_type: str
    verdict: Verdict
    recorded_digest: str | None
    derived_digest: str | None = None
    note: str | None = None
    response: ResponseVerdict = "none"
    response_note: str | None = None

    @property
    def covered(self) -> str:
        """What this check covers, in words (the CLI's line)."""
        request = {"verified": "request verified", "unverifiable": "request not verifiable"}
        words = [request.get(self.verdict, "request MISMATCH")]
        if self.response == "verified":
            words.append("response and usage verified")
        elif self.response == "mismatch":
            words.append("response or usage MISMATCH")
        elif self.response == "not covered":
            words.append(f"response not covered ({EARLIER})")
        return ", ".join(words)

    @property
    def where(self) -> str:
        return (
            f"seq {self.seq}, stream {self.stream!r} position {self.position} "
            f"(generation {self.generation})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "stream": self.stream,
            "position": self.position,
            "generation": self.generation,
            "kind": self.kind,
            "event_type": self.event_type,
            "verdict": self.verdict,
            "recorded_digest": self.recorded_digest,
            "derived_digest": self.derived_digest,
            "note": self.note,
            "response": self.response,
            "response_note": self.response_note,
        }


@dataclass(frozen=True)
class ChainBreak:
    """An event whose ``chain`` is not the hash of itself after the event before it."""

    seq: int
    stream: str
    position: int | None
    event_type: str
    note: str

    @property
    def where(self) -> str:
        at = (
            f", stream {self.stream!r} position {self.position}"
            if self.position is not None
            else ""
        )
        return f"seq {self.seq} ({self.event_type}{at})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "stream": self.stream,
            "position": self.position,
            "event_type": self.event_type,
            "note": self.note,
        }


@dataclass(frozen=True)
class ChainReport:
    """The run's hash chain: how many events it links, how many were written without
    one (by an earlier version), where it breaks, and its head (the last event's chain,
    which an auditor may keep elsewhere: the chain alone cannot tell that events were
    cut from the end of the log, nor resist someone who recomputes it)."""

    linked: int = 0
    not_covered: int = 0
    breaks: tuple[ChainBreak, ...] = ()
    head: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "linked": self.linked,
            "not_covered": self.not_covered,
            "breaks": [b.to_dict() for b in self.breaks],
            "head": self.head,
        }


@dataclass(frozen=True)
class RunVerification:
    run_id: str
    checks: tuple[StepCheck, ...]
    chain: ChainReport = ChainReport()

    def count(self, verdict: Verdict) -> int:
        return sum(1 for c in self.checks if c.verdict == verdict)

    def responses(self, verdict: ResponseVerdict) -> int:
        return sum(1 for c in self.checks if c.response == verdict)

    @property
    def ok(self) -> bool:
        """No mismatch of a request or a response, no break of the chain (unverifiable
        steps and what an earlier version recorded are reported, but are not a failure)."""
        return (
            self.count("mismatch") == 0
            and self.responses("mismatch") == 0
            and not self.chain.breaks
        )

    @property
    def mismatches(self) -> list[StepCheck]:
        return [c for c in self.checks if "mismatch" in (c.verdict, c.response)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "ok": self.ok,
            "steps": len(self.checks),
            "verified": self.count("verified"),
            "unverifiable": self.count("unverifiable"),
            "mismatch": self.count("mismatch"),
            "responses": {
                "verified": self.responses("verified"),
                "mismatch": self.responses("mismatch"),
                "not_covered": self.responses("not covered"),
            },
            "chain": self.chain.to_dict(),
            "checks": [c.to_dict() for c in self.checks],
        }


def verify_events(
    run_id: str,
    events: Sequence[Event],
    blobs: Mapping[str, object],
    texts: Mapping[int, str] | None = None,
) -> RunVerification:
    """The verdict on every step of ``events`` (one run's log in seq order, superseded
    steps included), given the blobs they reference and the payloads as stored
    (``texts``, by seq; without them the chain is not checked). Pure: no I/O."""
    names = waited_names(events)
    checks: list[StepCheck] = []
    for step in group_steps(events):
        checks.extend(_with_response(c, step) for c in _check_step(step, blobs, names))
    report = check_chain(events, texts) if texts is not None else ChainReport()
    return RunVerification(run_id, tuple(checks), report)


async def verify_run(store: RunStore, run_id: str) -> RunVerification:
    """Re-derive every digest of run ``run_id`` from its stored events and blobs, and
    check its responses and its chain."""
    if await store.get_run(run_id) is None:
        raise RunNotFound(f"no run with id {run_id!r}", run_id=run_id)
    events = await store.load_events(run_id)
    texts = await store.payload_texts(run_id)
    return verify_events(run_id, events, await load_blobs(store, events), texts)


def check_chain(events: Sequence[Event], texts: Mapping[int, str]) -> ChainReport:
    """Walk the log in seq order, recomputing each event's chain from the previous
    event's stored one (docs/digest.md §7)."""
    linked = not_covered = 0
    breaks: list[ChainBreak] = []
    prev: str | None = None
    before: Event | None = None
    for event in events:
        if event.chain is None:
            not_covered += 1
        else:
            text = texts.get(event.seq)
            expected = None if text is None else chain_hash(prev, event, text)
            if expected == event.chain:
                linked += 1
            else:
                breaks.append(_break(event, before, prev))
        prev, before = event.chain, event
    return ChainReport(linked, not_covered, tuple(breaks), prev)


def _break(event: Event, before: Event | None, prev: str | None) -> ChainBreak:
    after = f"the event before it (seq {before.seq})" if before else "the start of the log"
    if prev is None and before is not None:
        after += ", which has no chain,"
    note = (
        f"its chain does not follow from {after} and its own content: an event between "
        "them was deleted or moved, or this event (or the one before) was altered"
    )
    return ChainBreak(event.seq, event.stream, event.position, event.type, note)


def _with_response(check: StepCheck, step: RecordedStep) -> StepCheck:
    """``check`` with the verdict on the response of the step's event it names."""
    event = next((e for e in step.events if e.seq == check.seq), step.first)
    fields = RESPONSE_FIELDS.get(event.type)
    if fields is None or check.event_type != event.type:
        return check
    values = event.payload.__dict__
    recorded = values.get("response_digest")
    if recorded is None:
        return replace(check, response="not covered", response_note=f"response {EARLIER}")
    derived = response_digest(event.type, values)
    if derived == recorded:
        return replace(check, response="verified")
    note = (
        f"the recorded {', '.join(fields)} digest to {derived}, not to the recorded response "
        f"digest {recorded}: the answer or its usage was altered after it was recorded"
    )
    return replace(check, response="mismatch", response_note=note)


async def verify_runs(store: RunStore, run_ids: Iterable[str]) -> list[RunVerification]:
    return [await verify_run(store, run_id) for run_id in run_ids]


def _check_step(
    step: RecordedStep, blobs: Mapping[str, object], names: Sequence[str]
) -> list[StepCheck]:
    first = step.first

    def check(verdict: Verdict, derived: str | None = None, note: str | None = None) -> StepCheck:
        return StepCheck(
            first.seq,
            step.stream,
            step.position,
            step.generation,
            derived_kind,
            first.type,
            verdict,
            first.digest,
            derived,
            note,
        )

    derived_kind = step.kind
    # The step's other events (its completion) carry its digest too.
    checks = [
        _completion_check(step, e)
        for e in step.events
        if e is not first and e.digest is not None and e.digest != first.digest
    ]
    if first.digest is None:
        return [check("mismatch", note="the step's first event records no digest"), *checks]
    found = derive(step, blobs, names)
    if found.tampered is not None:
        return [check("mismatch", note=found.tampered), *checks]
    tried: list[str] = []
    for candidate in found.candidates:
        assert found.kind is not None  # a step of a kind this release reads back
        try:
            digest = request_digest(found.kind, candidate.body)
        except (InvalidInput, ValueError) as exc:  # a value with no canonical form
            return [check("unverifiable", note=f"its request has no canonical form: {exc}")]
        if digest == first.digest:
            return [check("verified", digest, candidate.note), *checks]
        tried.append(digest)
    if found.problem is not None:
        return [check("unverifiable", note=found.problem), *checks]
    note = (
        f"the {found.kind} request recorded in the log digests to {tried[0]}, "
        f"not to the recorded {first.digest}"
    )
    return [check("mismatch", tried[0] if tried else None, note), *checks]


def _completion_check(step: RecordedStep, event: Event) -> StepCheck:
    return StepCheck(
        event.seq,
        step.stream,
        step.position,
        step.generation,
        step.kind,
        event.type,
        "mismatch",
        event.digest,
        step.first.digest,
        f"this completion event records another digest than the step's first event "
        f"(seq {step.first.seq})",
    )
