"""The replay plan: before deploying, replay every in-flight run against the current code
without executing anything live, and report which streams would be invalidated, from
which step, with which digests, and what re-running the superseded suffix would cost.

It is the second driver over the journal (:mod:`toren.core.contract.journal`), next to the tick:
replays resolve from the log exactly as in a real tick, each ``Supersede`` the journal
answers is reported as a finding (nothing is written), and the first step that would run live
ends the plan. So the plan reports exactly what the next real resume would do up to the
first step it would execute live (later divergence depends on live results, which a plan
cannot know).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from decimal import Decimal
from functools import partial
from typing import Any, Protocol

from toren.core.agent_api.branches import Branches
from toren.core.agent_api.context import Context, RunUsage
from toren.core.agent_api.program import AgentProgram, AgentResolver
from toren.core.contract import policy
from toren.core.contract.changes import (
    RequestParts,
    body_parts,
    diff,
    live_model_parts,
    recorded_parts,
)
from toren.core.contract.digest import HashCache, HashedRequest
from toren.core.contract.events import Event, ModelCallRecorded
from toren.core.contract.journal import Journal, Replay, Supersede
from toren.core.contract.model_types import ModelRequest, ModelResponse
from toren.core.contract.plans import RunPlan, StreamFinding
from toren.core.contract.ports import Store
from toren.core.contract.recorded import RecordedStep, derive, load_blobs, waited_names
from toren.core.contract.records import RunRecord
from toren.core.contract.replay import RunLog, Step
from toren.core.contract.values import IN_FLIGHT_STATUSES, RunStatus, StepKind
from toren.core.drivers.effects import (
    replay_child,
    replay_message,
    replay_model,
    replay_tool,
    replay_value,
)
from toren.core.drivers.gcpause import ReplayGcPause
from toren.core.drivers.tickstate import TickDeps
from toren.errors import AgentNotFound, CorruptEventLog

PLAN_LIMIT = 500  # in-flight runs planned per report: a plan replays each run's log
PLAN_CONCURRENCY = 8  # runs planned at once (see plan_runs)


class PlanRunner:
    """The dry run: a second driver over :meth:`Journal.request`. Replayed steps answer
    from the log as in a tick; every ``Supersede`` the journal answers becomes a
    :class:`StreamFinding`; the first step that would run live ends the plan (see
    :meth:`_hold`). Nothing is written."""

    def __init__(self, deps: TickDeps, run: RunRecord, programs: Programs | None = None) -> None:
        self.deps = deps
        self.store = deps.store
        self.run = run
        self.run_id = run.id
        self.programs = programs or Programs(deps.agents)
        self.hashes = HashCache()
        self.journal = Journal(run.id)
        self.branches = Branches()  # ctx.gather/task_group bookkeeping (a plan never parks)
        self.code_version = deps.code_version or "dev"
        self.replayed = 0
        self.findings: list[StreamFinding] = []
        # Per finding the recorded step and the request now asked, to say what changed.
        self._compare: list[tuple[int, Step, RequestParts]] = []
        self._task: asyncio.Task[object] | None = None

    @property
    def log(self) -> RunLog:
        return self.journal.log

    @property
    def raised_limits(self) -> Mapping[str, object]:
        return self.journal.raised_limits

    def usage(self) -> RunUsage:
        return RunUsage.from_totals(self.journal.usage_at())

    async def plan(self) -> RunPlan:
        run = self.run  # as listed: the plan reads no run row again
        try:
            program = self.programs.resolve(run.agent, run.process)
        except AgentNotFound as exc:
            return self._plan(run, "?", problem=exc.message)
        self.code_version = self.deps.code_version or program.code_version
        try:
            events = await self.store.load_events(self.run_id, at_least=run.steps)
        except CorruptEventLog as exc:
            return self._plan(run, self.code_version, problem=exc.message)
        self.journal = Journal.fold(self.run_id, events)
        root = Context(self, run.process, program, run.input)
        # A plan is all replay: the cycle collector is paused for it as for a tick's
        # replay (ReplayGcPause), or it would re-scan the plans' growing object graphs.
        paused = self.deps.settings.pause_gc_on_replay
        if paused:
            ReplayGcPause.begin()
        task = self._task = asyncio.ensure_future(self._main(root))
        try:
            try:
                await task
            except asyncio.CancelledError:  # ended by a hold, unless this plan is stopped
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
            except Exception:  # ended by the code (its failure would be recorded live)
                pass
        finally:
            if not task.done():
                task.cancel()
            self._task = None  # no cycle through the agent task (see TickRunner.run)
            if paused:
                ReplayGcPause.end()
        await self._say_what_changed(events)
        return self._plan(run, self.code_version)

    async def _main(self, ctx: Context) -> None:
        await ctx.program.fn(ctx, ctx.input)
        self._end_stream(ctx)

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

    # -- the journal's answers, as findings --------------------------------------------------

    def _ask(
        self,
        stream: str,
        pos: int,
        kind: StepKind,
        digest: str,
        asking: Callable[[], RequestParts],
        reusable: bool = True,
    ) -> Replay | None:
        """The replayed step, or None: the step would run live (its branch holds).
        ``asking`` builds the request's parts, needed only to say what changed in a
        finding: a replayed step (nearly every one) never builds them. ``reusable``: the
        tool policy, as the tick asks it. No ``live_versions`` (see core/contract/policy.py)."""
        answer = self.journal.request(
            stream, pos, kind, digest, code_version=self.code_version, reusable=reusable
        )
        if isinstance(answer, Replay):
            return answer
        if isinstance(answer, Supersede):
            self._found(answer, asking())
        return None

    def _end_stream(self, ctx: Context) -> None:
        answer = self.journal.end_stream(
            ctx.stream, ctx.positions_taken, code_version=self.code_version
        )
        if isinstance(answer, Supersede):
            self._found(answer, None)

    def _found(self, answer: Supersede, asking: RequestParts | None) -> None:
        suffix = answer.superseded
        calls = [s.first.payload for s in suffix if isinstance(s.first.payload, ModelCallRecorded)]
        said = answer.payload
        self.findings.append(
            StreamFinding(
                stream=answer.stream,
                from_pos=answer.from_pos,
                cause=answer.cause,
                expected_digest=said.expected_digest,
                actual_digest=said.actual_digest,
                expected_kind=said.expected_kind,
                actual_kind=said.actual_kind,
                written_by=tuple(sorted({s.code_version for s in suffix})),
                suffix_steps=len(suffix),
                suffix_model_calls=len(calls),
                suffix_tokens=sum(c.input_tokens + c.output_tokens for c in calls),
                suffix_cost_usd=sum((Decimal(c.cost_usd) for c in calls), Decimal(0)),
            )
        )
        if answer.expected is not None and asking is not None:
            self._compare.append((len(self.findings) - 1, answer.expected, asking))

    async def _hold(self) -> Any:
        """A step that would run live ends the plan: the branches that are ready to run
        take their turn first (their replays and findings count), then every branch
        stops (what they would do next, the live results would decide)."""
        await asyncio.sleep(0)
        if self._task is not None:
            self._task.cancel()
        await asyncio.Future()  # cancelled with the agent task

    async def _replay(self, answer: Callable[[Step], Any], step: Step) -> Any:
        self.replayed += 1
        return answer(step)

    # -- the StepRunner the contexts call ----------------------------------------------------

    def model_step(
        self,
        ctx: Context,
        pos: int,
        hashed: HashedRequest,
        request: ModelRequest,
        on_delta: Callable[[str], None] | None,
    ) -> Awaitable[ModelResponse]:
        asking = partial(live_model_parts, request, hashed)
        replay = self._ask(ctx.stream, pos, StepKind.MODEL, hashed.digest, asking)
        return self._replay(replay_model, replay.step) if replay else self._hold()

    def tool_step(
        self, ctx: Context, pos: int, digest: str, name: str, args: dict[str, object]
    ) -> Awaitable[object]:
        asking = partial(body_parts, StepKind.TOOL, {"name": name, "args": args})
        reusable = policy.tool_reusable(ctx.program.tools.get(name))  # as the tick asks
        replay = self._ask(ctx.stream, pos, StepKind.TOOL, digest, asking, reusable)
        return self._replay(replay_tool, replay.step) if replay else self._hold()

    def value_step(self, ctx: Context, pos: int, digest: str, what: str) -> Awaitable[object]:
        asking = partial(body_parts, StepKind.VALUE, {"what": what})
        replay = self._ask(ctx.stream, pos, StepKind.VALUE, digest, asking)
        return self._replay(replay_value, replay.step) if replay else self._hold()

    def sleep_step(self, ctx: Context, pos: int, digest: str, seconds: float) -> Awaitable[None]:
        asking = partial(body_parts, StepKind.SLEEP, {"seconds": seconds})
        replay = self._ask(ctx.stream, pos, StepKind.SLEEP, digest, asking)
        if replay is None or not replay.step.complete:
            return self._hold()
        self.replayed += 1
        return _done(None)

    def message_step(
        self, ctx: Context, pos: int, digest: str, name: str, timeout: float | None
    ) -> Awaitable[object]:
        asking = partial(body_parts, StepKind.MESSAGE, {"name": name, "timeout": timeout})
        replay = self._ask(ctx.stream, pos, StepKind.MESSAGE, digest, asking)
        if replay is None or not replay.step.complete:
            return self._hold()
        self.replayed += 1
        return _done(replay_message(replay.step))

    def child_step(
        self, ctx: Context, pos: int, digest: str, process: str, input: object
    ) -> Awaitable[object]:
        asking = partial(body_parts, StepKind.CHILD, {"process": process, "input": input})
        replay = self._ask(ctx.stream, pos, StepKind.CHILD, digest, asking)
        if replay is None:
            return self._hold()
        if not replay.step.complete:  # a child still running: replay its stream too
            return self._run_child(ctx, pos, process, input)
        return self._replay(replay_child, replay.step)

    async def _run_child(self, ctx: Context, pos: int, process: str, input: object) -> object:
        child_stream = f"{ctx.stream}/{pos}"
        program = self.programs.resolve(ctx.agent, process)
        child = Context(self, child_stream, program, input)
        try:
            await program.fn(child, input)
        except Exception:
            return await self._hold()  # its failure would be recorded live
        self._end_stream(child)
        return await self._hold()  # its completion would be recorded live


async def _done(value: Any) -> Any:
    return value


async def plan_run(deps: TickDeps, run: RunRecord) -> RunPlan:
    return await PlanRunner(deps, run).plan()


async def plan_runs(
    store: Store,
    agents: AgentResolver,
    *,
    deps: TickDeps | None = None,
    statuses: Sequence[RunStatus] = IN_FLIGHT_STATUSES,
    limit: int = 10_000,
) -> list[RunPlan]:
    """Plan every in-flight run (queued, running, waiting), newest first, at most ``limit``.

    Up to :data:`PLAN_CONCURRENCY` runs are planned at once, so the database reads one
    run's log while another run replays; the plans come back in the listing's order, each
    as it would be planned alone (a run's plan shares nothing mutable with another's but
    the resolved programs, see :class:`Programs`)."""
    deps = deps or TickDeps(store=store, agents=agents)
    # The next page is listed while the runs of the last one are planned.
    return await plan_listed(deps, _listed(store, statuses, limit))


async def plan_listed(
    deps: TickDeps, runs: AsyncIterator[RunRecord] | Sequence[RunRecord]
) -> list[RunPlan]:
    """Plan these runs (as listed: the plan reads no run row again), up to
    :data:`PLAN_CONCURRENCY` at once, in their order."""
    programs = Programs(deps.agents)
    gate = asyncio.Semaphore(PLAN_CONCURRENCY)

    async def plan(run: RunRecord) -> RunPlan:
        async with gate:
            return await PlanRunner(deps, run, programs).plan()

    tasks: list[asyncio.Task[RunPlan]] = []
    try:
        if isinstance(runs, Sequence):
            tasks = [asyncio.ensure_future(plan(run)) for run in runs]
        else:
            async for run in runs:
                tasks.append(asyncio.ensure_future(plan(run)))
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # The first error is raised as itself (a StorageError stays one for the API, not
        # an ExceptionGroup), once the other plans are stopped.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _listed(
    store: Store, statuses: Sequence[RunStatus], limit: int
) -> AsyncIterator[RunRecord]:
    """The runs of ``statuses``, newest first within each status, at most ``limit``."""
    count = 0
    for status in statuses:
        cursor = None
        while count < limit:
            page = await store.list_runs(
                status=status, limit=min(200, limit - count), before=cursor
            )
            if not page:
                break
            for run in page:
                yield run
            count += len(page)
            cursor = page[-1].id


class Shards(Protocol):
    """Plans listed runs, some of them elsewhere (other processes), with ``here`` planning
    the ones it keeps; returns every run's plan (as :meth:`RunPlan.to_dict`) in the order
    of ``runs``."""

    async def plan(
        self,
        runs: Sequence[RunRecord],
        here: Callable[[Sequence[RunRecord]], Awaitable[list[dict[str, object]]]],
    ) -> list[dict[str, Any]]: ...


class Programs:
    """The programs of one plan, resolved once per (agent, process) and shared by its runs:
    an agent's runs replay against the same code (a directory resolver would otherwise
    check the agent's directory again for every run), and what the program holds (a system
    prompt, tool specs) is the same objects in every run. An unknown agent is remembered
    as such; any other error of the resolver is raised each time, as before."""

    def __init__(self, agents: AgentResolver) -> None:
        self.agents = agents
        self._found: dict[tuple[str, str], AgentProgram | AgentNotFound] = {}

    def resolve(self, agent: str, process: str) -> AgentProgram:
        key = (agent, process)
        found = self._found.get(key)
        if found is None:
            try:
                found = self.agents.resolve(agent, process)
            except AgentNotFound as exc:
                found = exc
            self._found[key] = found
        if isinstance(found, AgentNotFound):
            # A new one each time (one exception object raised again and again would
            # gather every raise's traceback), of the same class, message and details.
            try:
                again = type(found)(found.message, **found.details)
            except TypeError:  # a resolver's own subclass, with its own constructor
                again = AgentNotFound(found.message, **found.details)
            raise again
        return found


async def plan_report(
    store: Store,
    agents: AgentResolver,
    *,
    code_version: str | None = None,
    limit: int = PLAN_LIMIT,
    shards: Shards | None = None,
) -> dict[str, object]:
    """The replay plan as one JSON document (``GET /v1/plan``, ``toren plan --json``).
    With ``shards``, the listed runs are planned by it (``toren plan`` shares them out to
    worker processes, see :mod:`toren.cli.plan_pool`), the plans in the listing's order."""
    started = time.perf_counter()
    deps = TickDeps(store=store, agents=agents, code_version=code_version)
    # One run beyond the limit is listed to know whether any was left out: a plan is
    # never silently partial.
    listed = [run async for run in _listed(store, IN_FLIGHT_STATUSES, limit + 1)]
    more = len(listed) > limit
    del listed[limit:]

    async def here(runs: Sequence[RunRecord]) -> list[dict[str, Any]]:
        return [p.to_dict() for p in await plan_listed(deps, runs)]

    plans = await (here(listed) if shards is None else shards.plan(listed, here))
    rerun = sum((Decimal(p["rerun_cost_usd"]) for p in plans), Decimal(0))
    return {
        "plans": plans,
        "runs": len(plans),
        "more": more,
        "invalidated": sum(1 for p in plans if p["findings"]),
        "problems": sum(1 for p in plans if p["problem"]),
        "rerun_cost_usd": str(rerun),
        "elapsed_ms": round((time.perf_counter() - started) * 1000, 1),
    }
