"""What ``toren plan`` reports per run (:class:`RunPlan`) and per disputed stream
(:class:`StreamFinding`): plain values, made by the dry run in
:mod:`toren.core.drivers.plan` and read by the API, the CLI and the console."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from toren.core.contract.values import InvalidationCause

__all__ = ["RunPlan", "StreamFinding"]


@dataclass(frozen=True)
class StreamFinding:
    stream: str
    from_pos: int
    cause: InvalidationCause
    expected_digest: str | None
    actual_digest: str | None
    expected_kind: str | None
    actual_kind: str | None
    written_by: tuple[str, ...]
    suffix_steps: int
    suffix_model_calls: int
    suffix_tokens: int
    # USD as the log spells it, summed: a report (an edge), whose spelling is the sum of
    # the recorded ``cost_usd`` strings (``0.0110``), pinned by the corpus. Nano-USD
    # would normalise it (``0.011``) and round past the ninth decimal.
    suffix_cost_usd: Decimal
    # What differs between the recorded request at from_pos and the current code's
    # (message 0 changed, tool X's spec changed, parameter temperature 0.2 -> 0.7).
    changes: tuple[dict[str, object], ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "stream": self.stream,
            "from_pos": self.from_pos,
            "cause": self.cause,
            "expected_digest": self.expected_digest,
            "actual_digest": self.actual_digest,
            "expected_kind": self.expected_kind,
            "actual_kind": self.actual_kind,
            "written_by": list(self.written_by),
            "suffix_steps": self.suffix_steps,
            "suffix_model_calls": self.suffix_model_calls,
            "suffix_tokens": self.suffix_tokens,
            "suffix_cost_usd": str(self.suffix_cost_usd),
            "changes": list(self.changes),
        }


@dataclass(frozen=True)
class RunPlan:
    run_id: str
    agent: str
    process: str
    status: str
    code_version: str
    replayed_steps: int = 0
    findings: tuple[StreamFinding, ...] = ()
    problem: str | None = None  # the run cannot be planned (unknown agent, corrupt log)
    streams: tuple[str, ...] = field(default_factory=tuple)

    @property
    def clean(self) -> bool:
        return not self.findings and self.problem is None

    def to_dict(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "agent": self.agent,
            "process": self.process,
            "status": self.status,
            "code_version": self.code_version,
            "clean": self.clean,
            "replayed_steps": self.replayed_steps,
            "streams": list(self.streams),
            "findings": [f.to_dict() for f in self.findings],
            "problem": self.problem,
            "rerun_cost_usd": str(sum((f.suffix_cost_usd for f in self.findings), Decimal(0))),
        }
