"""Worker processes for ``toren plan``: a plan replays every in-flight run's log through
the agent code, which is Python CPU time, so one process plans on one core however many
the machine has. With ``--jobs N`` the plan shares the listed runs out to N - 1 worker
processes beside its own, each with its own connection and its own copy of the agents.

The workers are started before anything else runs (no event loop, no database thread):
on Linux they are forked then, so they start in milliseconds with every module already
imported; where forking is not safe (another thread already runs, or the platform does
not fork) they are spawned, which costs an interpreter start and the imports. Each opens
its runtime at once, while the parent lists the runs, then waits for its share.

Shares are balanced by the runs' recorded step counts (replay time grows with them). A
plan too small to gain from it (fewer than :data:`MIN_SHARED_STEPS` steps in all) is
planned by the parent alone, and the workers are told to stop. Every worker's answer is
checked: the plans of one agent must name one code version (a file saved while the
workers loaded the agents would otherwise mix two versions into one report).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from toren.core.plan import plan_listed
from toren.core.records import RunRecord
from toren.core.tickstate import TickDeps
from toren.errors import TorenError

# Below this many recorded steps in all, the parent plans alone: a worker's share would
# take less time than handing it over.
MIN_SHARED_STEPS = 2_000
MAX_JOBS = 16
# The default: each process opens its own connections (a PostgreSQL worker process holds
# a few), so the default stays small whatever the machine; --jobs asks for more.
DEFAULT_MAX_JOBS = 4


class PlanWorkerFailed(TorenError):
    """A plan worker process failed or died: the plan is incomplete."""


def default_jobs() -> int:
    """The cores this process may run on, at most :data:`DEFAULT_MAX_JOBS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, DEFAULT_MAX_JOBS))


class PlanPool:
    """``jobs - 1`` worker processes (see the module docstring); use as a context
    manager around the plan, and pass it to :func:`toren.core.plan.plan_report` as
    ``shards``."""

    def __init__(
        self,
        jobs: int,
        agents_root: Path,
        database_url: str | None,
        code_version: str | None,
        *,
        min_shared_steps: int = MIN_SHARED_STEPS,
        method: str | None = None,
    ) -> None:
        self.jobs = jobs
        self.min_shared_steps = min_shared_steps
        self.method = method  # None: fork where it is safe when the workers start, else spawn
        self._args = (str(agents_root), database_url, code_version)
        self._workers: list[tuple[Any, Connection]] = []
        self.planned: list[int] = []  # runs planned by this process, then by each worker

    def __enter__(self) -> PlanPool:
        if self.jobs <= 1:
            return self
        if self.method is None:
            # Forking copies one thread only: safe only while this is the sole one.
            forkable = sys.platform == "linux" and threading.active_count() == 1
            self.method = "fork" if forkable else "spawn"
        context: Any = multiprocessing.get_context(self.method)
        ends: list[Connection] = []  # this process's ends of every pipe made so far
        for _ in range(self.jobs - 1):
            ours, theirs = context.Pipe()
            ends.append(ours)
            # A forked worker inherits this process's ends of its own pipe and the earlier
            # ones: it closes them first, or its pipe would never report this process gone
            # (killed, say) and it would wait for work forever. A spawned one inherits none.
            inherited = list(ends) if self.method == "fork" else []
            process = context.Process(
                target=_worker_main, args=(theirs, inherited, *self._args), daemon=True
            )
            process.start()
            theirs.close()
            self._workers.append((process, ours))
        return self

    def __exit__(self, *exc: object) -> None:
        for _, conn in self._workers:
            try:
                conn.send(None)  # nothing (more) to plan: stop
            except (BrokenPipeError, OSError):
                pass
            conn.close()
        deadline = time.monotonic() + 5  # one grace period for all, not one each
        for process, _ in self._workers:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        self._workers = []

    def _stop(self) -> None:
        for process, _ in self._workers:
            process.kill()

    async def plan(
        self,
        runs: Sequence[RunRecord],
        here: Callable[[Sequence[RunRecord]], Awaitable[list[dict[str, object]]]],
    ) -> list[dict[str, object]]:
        if not self._workers or sum(max(r.steps, 1) for r in runs) < self.min_shared_steps:
            return await here(runs)
        shares = share_out(runs, len(self._workers) + 1)
        try:
            for (process, conn), share in zip(self._workers, shares[1:], strict=True):
                try:
                    conn.send(list(share))
                except OSError:  # BrokenPipeError: it died before its share was sent
                    raise _died(process) from None
            answers = [asyncio.to_thread(_answer, p, c) for p, c in self._workers]
            found = await asyncio.gather(here(shares[0]), *answers)
        except BaseException:
            # The plan is lost: stop the workers now (their pipes close, so the threads
            # waiting for their answers end) rather than wait for shares nobody will read.
            self._stop()
            raise
        self.planned = [len(plans) for plans in found]  # by this process, then each worker
        by_id = {p["run_id"]: p for plans in found for p in plans}
        plans = [by_id[r.id] for r in runs]
        _one_version_per_agent(plans)
        return plans


def share_out(runs: Sequence[RunRecord], n: int) -> list[list[RunRecord]]:
    """``runs`` in ``n`` shares of about equal recorded steps (the largest run first, each
    to the share with the fewest steps so far); each share keeps the listing's order."""
    shares: list[list[tuple[int, RunRecord]]] = [[] for _ in range(n)]
    loads = [0] * n
    for index, run in sorted(enumerate(runs), key=lambda item: -item[1].steps):
        least = loads.index(min(loads))
        shares[least].append((index, run))
        loads[least] += max(run.steps, 1)
    return [[run for _, run in sorted(share, key=lambda item: item[0])] for share in shares]


def _answer(process: object, conn: Connection) -> list[dict[str, object]]:
    try:
        kind, value = conn.recv()
    except (EOFError, OSError):
        raise _died(process) from None
    if kind == "error":
        raise PlanWorkerFailed(f"a plan worker failed: {value}")
    plans: list[dict[str, object]] = value
    return plans


def _died(process: Any) -> PlanWorkerFailed:
    process.join(timeout=1)  # it is gone or going: its exit code, if it has one yet
    return PlanWorkerFailed(
        f"a plan worker process exited (code {process.exitcode}) before answering; run "
        "toren plan again, or with --jobs 1 to plan in this process alone"
    )


def _one_version_per_agent(plans: Sequence[dict[str, Any]]) -> None:
    seen: dict[tuple[str, str], str] = {}
    for plan in plans:
        if plan["problem"]:
            continue
        key = (plan["agent"], plan["process"])
        version = seen.setdefault(key, plan["code_version"])
        if version != plan["code_version"]:
            raise PlanWorkerFailed(
                f"the code of agent {plan['agent']!r} changed while it was planned (code "
                f"versions {version} and {plan['code_version']}): run toren plan again"
            )


def _worker_main(
    conn: Connection,
    inherited: list[Connection],
    agents_root: str,
    database_url: str | None,
    code_version: str | None,
) -> None:
    for end in inherited:
        end.close()
    try:
        asyncio.run(_worker(conn, Path(agents_root), database_url, code_version))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent reports
        pass
    finally:
        conn.close()


async def _worker(
    conn: Connection, agents_root: Path, database_url: str | None, code_version: str | None
) -> None:
    from toren.cli._common import open_existing_runtime
    from toren.runtime import close_runtime

    # Open at once (while the parent lists the runs); a failure is told when asked.
    try:
        runtime = await open_existing_runtime(agents_root, database_url, code_version)
    except Exception as exc:
        failure: Exception | None = exc
    else:
        failure = None
    try:
        while True:
            runs = await asyncio.to_thread(_receive, conn)
            if runs is None:
                return
            if failure is not None:
                conn.send(("error", _said(failure)))
                continue
            try:
                deps = TickDeps(
                    store=runtime.store,
                    agents=runtime.resolver,
                    code_version=runtime.deps.code_version,
                )
                plans = [p.to_dict() for p in await plan_listed(deps, runs)]
            except Exception as exc:
                conn.send(("error", _said(exc)))
            else:
                conn.send(("ok", plans))
    finally:
        if failure is None:
            await close_runtime(runtime)


def _receive(conn: Connection) -> list[RunRecord] | None:
    try:
        runs: list[RunRecord] | None = conn.recv()
    except (EOFError, OSError):  # the parent is gone
        return None
    return runs


def _said(exc: BaseException) -> str:
    message = exc.message if isinstance(exc, TorenError) else str(exc)
    return f"{type(exc).__name__}: {message}"
