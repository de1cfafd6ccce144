"""The replay plan: before deploying, replay every in-flight run against the current code
without executing anything live, and report which streams would be invalidated, from
which step, with which digests, and what re-running the superseded suffix would cost.

It is a tick in dry-run mode: replays resolve from the log exactly as in a real tick,
while every step that would run live, and every invalidation, holds its branch instead
of acting. So the plan reports exactly what the next real resume would do up to the
first step it would execute live (later divergence depends on live results, which a plan
cannot know).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from toren.core.changes import RequestParts, body_parts, diff, live_model_parts, recorded_parts
from toren.core.context import Context
from toren.core.digest import HashedRequest
from toren.core.events import Event, ModelCallRecorded
from toren.core.model_types import ModelRequest
from toren.core.ports import Store
from toren.core.program import AgentResolver
from toren.core.recorded import RecordedStep, derive, load_blobs, waited_names
from toren.core.records import Lease, RunRecord
from toren.core.replay import RunLog, Step, descendants
from toren.core.tick import TickDeps, TickRunner
from toren.errors import AgentNotFound, CorruptEventLog

IN_FLIGHT = ("queued", "running", "waiting")
PLAN_LIMIT = 500  # in-flight runs planned per report: a plan replays each run's log


@dataclass(frozen=True)
class StreamFinding:
    stream: str
    from_pos: int
    cause: str
    expected_digest: str | None
    actual_digest: str | None
    expected_kind: str | None
    actual_kind: str | None
    written_by: tuple[str, ...]
    suffix_steps: int
    suffix_model_calls: int
    suffix_tokens: int
    suffix_cost_usd: Decimal
    # What differs between the recorded request at from_pos and the current code's
    # (message 0 changed, tool X's spec changed, parameter temperature 0.2 -> 0.7).
    changes: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
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

    def to_dict(self) -> dict[str, Any]:
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


class PlanRunner(TickRunner):
    """A tick that only replays: live steps and invalidations hold their branch."""

    def __init__(self, deps: TickDeps, run: RunRecord) -> None:
        super().__init__(deps, Lease(run.id, "plan", -1))
        self.findings: list[StreamFinding] = []
        # The request of the step being decided (set just before its decision, which is
        # taken synchronously at call time), and per finding the two requests to compare.
        self._asking: RequestParts | None = None
        self._compare: list[tuple[int, Step, RequestParts]] = []

    async def plan(self) -> RunPlan:
        run = await self.store.get_run(self.run_id)
        assert run is not None
        try:
            program = self.deps.agents.resolve(run.agent, run.process)
        except AgentNotFound as exc:
            return self._plan(run, "?", problem=exc.message)
        self.code_version = self.deps.code_version or program.code_version
        try:
            events = await self.store.load_events(self.run_id)
        except CorruptEventLog as exc:
            return self._plan(run, self.code_version, problem=exc.message)
        self.log = RunLog.fold(self.run_id, events)
        root = Context(self, run.process, program, run.input)
        self._task = asyncio.ensure_future(self._main(root))
        try:
            await self._drive()
        finally:
            if not self._task.done():
                self._task.cancel()
            self._task = None  # no cycle through the agent task (see TickRunner.run)
        await self._say_what_changed(events)
        return self._plan(run, self.code_version)

    async def _say_what_changed(self, events: list[Event]) -> None:
        if not self._compare:
            return
        blobs = await load_blobs(self.store, events)
        names = waited_names(events)
        for index, step, asking in self._compare:
            recorded = [e for e in (step.first, step.done) if e is not None]
            first = recorded[0]
            position = first.position if first.position is not None else step.position
            old = recorded_parts(
                derive(
                    RecordedStep(first.stream, first.generation, position, recorded), blobs, names
                )
            )
            if old is not None:
                changes = tuple(c.to_dict() for c in diff(old, asking))
                self.findings[index] = dataclasses.replace(self.findings[index], changes=changes)

    def _plan(self, run: RunRecord, version: str, problem: str | None = None) -> RunPlan:
        return RunPlan(
            run.id,
            run.agent,
            run.process,
            run.status,
            version,
            replayed_steps=self.replayed,
            findings=tuple(self.findings),
            problem=problem,
            streams=tuple(sorted(self.log.streams)),
        )

    # -- dry-run overrides ------------------------------------------------------------------

    def _invalidate(
        self,
        stream: str,
        from_pos: int,
        *,
        expected: Step | None,
        actual_kind: str | None,
        actual_digest: str | None,
    ) -> None:
        view = self.log.stream(stream)
        suffix = [s for p, s in sorted(view.steps.items()) if p >= from_pos]
        children = [
            s.first.payload.child_stream  # type: ignore[attr-defined]
            for s in suffix
            if s.first.type == "ChildStarted"
        ]
        for child in descendants(self.log, children):
            suffix.extend(self.log.stream(child).steps.values())
        calls = [s.first.payload for s in suffix if isinstance(s.first.payload, ModelCallRecorded)]
        if expected is None:
            cause = "stream_ended"
        elif expected.kind != actual_kind:
            cause = "kind_mismatch"
        else:
            cause = "digest_mismatch"
        self.findings.append(
            StreamFinding(
                stream=stream,
                from_pos=from_pos,
                cause=cause,
                expected_digest=expected.digest if expected else None,
                actual_digest=actual_digest,
                expected_kind=expected.kind if expected else None,
                actual_kind=actual_kind,
                written_by=tuple(sorted({s.code_version for s in suffix})),
                suffix_steps=len(suffix),
                suffix_model_calls=len(calls),
                suffix_tokens=sum(c.input_tokens + c.output_tokens for c in calls),
                suffix_cost_usd=sum((Decimal(c.cost_usd) for c in calls), Decimal(0)),
            )
        )
        if expected is not None and self._asking is not None:
            self._compare.append((len(self.findings) - 1, expected, self._asking))
        view.truncate(from_pos)

    # The request each kind of step makes, noted for saying what changed.
    def model_step(
        self,
        ctx: Context,
        pos: int,
        hashed: HashedRequest,
        request: ModelRequest,
        *rest: Any,
        **kw: Any,
    ) -> Any:
        self._asking = live_model_parts(request, hashed)
        return super().model_step(ctx, pos, hashed, request, *rest, **kw)

    def tool_step(
        self,
        ctx: Context,
        pos: int,
        digest: str,
        name: str,
        args: dict[str, Any],
        *rest: Any,
        **kw: Any,
    ) -> Any:
        self._asking = body_parts("tool", {"name": name, "args": args})
        return super().tool_step(ctx, pos, digest, name, args, *rest, **kw)

    def value_step(
        self, ctx: Context, pos: int, digest: str, what: str, *rest: Any, **kw: Any
    ) -> Any:
        self._asking = body_parts("value", {"what": what})
        return super().value_step(ctx, pos, digest, what, *rest, **kw)

    def sleep_step(
        self, ctx: Context, pos: int, digest: str, seconds: float, *rest: Any, **kw: Any
    ) -> Any:
        self._asking = body_parts("sleep", {"seconds": seconds})
        return super().sleep_step(ctx, pos, digest, seconds, *rest, **kw)

    def message_step(
        self,
        ctx: Context,
        pos: int,
        digest: str,
        name: str,
        timeout: float | None,
        *rest: Any,
        **kw: Any,
    ) -> Any:
        self._asking = body_parts("message", {"name": name, "timeout": timeout})
        return super().message_step(ctx, pos, digest, name, timeout, *rest, **kw)

    def child_step(
        self, ctx: Context, pos: int, digest: str, process: str, input: Any, *rest: Any, **kw: Any
    ) -> Any:
        self._asking = body_parts("child", {"process": process, "input": input})
        return super().child_step(ctx, pos, digest, process, input, *rest, **kw)

    async def _hold(self, *_: Any, **__: Any) -> Any:
        async with self._busy():
            await self._park(None, ())

    _live_model = _hold
    _live_tool = _hold
    _live_value = _hold
    _start_timer = _hold
    _await_timer = _hold
    _start_message_wait = _hold
    _await_message = _hold

    async def _run_child(
        self,
        ctx: Context,
        pos: int,
        gen: int,
        digest: str,
        process: str,
        input: Any,
        live: bool,
        continues: str | None = None,
    ) -> Any:
        if live:
            return await self._hold()
        return await super()._run_child(ctx, pos, gen, digest, process, input, live)


async def plan_run(deps: TickDeps, run: RunRecord) -> RunPlan:
    return await PlanRunner(deps, run).plan()


async def plan_runs(
    store: Store,
    agents: AgentResolver,
    *,
    deps: TickDeps | None = None,
    statuses: Sequence[str] = IN_FLIGHT,
    limit: int = 10_000,
) -> list[RunPlan]:
    """Plan every in-flight run (queued, running, waiting), newest first."""
    deps = deps or TickDeps(store=store, agents=agents)
    plans: list[RunPlan] = []
    for status in statuses:
        cursor = None
        while len(plans) < limit:
            page = await store.list_runs(status=status, limit=200, before=cursor)
            if not page:
                break
            for run in page:
                plans.append(await plan_run(deps, run))
            cursor = page[-1].id
    return plans


async def plan_report(
    store: Store,
    agents: AgentResolver,
    *,
    code_version: str | None = None,
    limit: int = PLAN_LIMIT,
) -> dict[str, Any]:
    """The replay plan as one JSON document (``GET /v1/plan``, ``toren plan --json``)."""
    started = time.perf_counter()
    deps = TickDeps(store=store, agents=agents, code_version=code_version)
    plans = [p.to_dict() for p in await plan_runs(store, agents, deps=deps, limit=limit)]
    rerun = sum((Decimal(p["rerun_cost_usd"]) for p in plans), Decimal(0))
    return {
        "plans": plans,
        "runs": len(plans),
        "invalidated": sum(1 for p in plans if p["findings"]),
        "problems": sum(1 for p in plans if p["problem"]),
        "rerun_cost_usd": str(rerun),
        "elapsed_ms": round((time.perf_counter() - started) * 1000, 1),
    }
