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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from toren.core.digest import request_digest
from toren.core.events import Event
from toren.core.ports import RunStore
from toren.core.recorded import RecordedStep, derive, group_steps, load_blobs, waited_names
from toren.core.values import StepKind
from toren.errors import InvalidInput, RunNotFound

Verdict = Literal["verified", "unverifiable", "mismatch"]


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
        }


@dataclass(frozen=True)
class RunVerification:
    run_id: str
    checks: tuple[StepCheck, ...]

    def count(self, verdict: Verdict) -> int:
        return sum(1 for c in self.checks if c.verdict == verdict)

    @property
    def ok(self) -> bool:
        """No mismatch (unverifiable steps are reported, with why, but are not a failure)."""
        return self.count("mismatch") == 0

    @property
    def mismatches(self) -> list[StepCheck]:
        return [c for c in self.checks if c.verdict == "mismatch"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "ok": self.ok,
            "steps": len(self.checks),
            "verified": self.count("verified"),
            "unverifiable": self.count("unverifiable"),
            "mismatch": self.count("mismatch"),
            "checks": [c.to_dict() for c in self.checks],
        }


def verify_events(
    run_id: str, events: Sequence[Event], blobs: Mapping[str, object]
) -> RunVerification:
    """The verdict on every step of ``events`` (one run's log, superseded steps included),
    given the blobs they reference. Pure: no I/O."""
    names = waited_names(events)
    checks: list[StepCheck] = []
    for step in group_steps(events):
        checks.extend(_check_step(step, blobs, names))
    return RunVerification(run_id, tuple(checks))


async def verify_run(store: RunStore, run_id: str) -> RunVerification:
    """Re-derive every digest of run ``run_id`` from its stored events and blobs."""
    if await store.get_run(run_id) is None:
        raise RunNotFound(f"no run with id {run_id!r}", run_id=run_id)
    events = await store.load_events(run_id)
    return verify_events(run_id, events, await load_blobs(store, events))


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
