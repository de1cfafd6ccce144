"""Worker processes for ``toren plan``: a plan replays every in-flight run's log through
the agent code, which is Python CPU time, so one process plans on one core however many
the machine has. With ``--jobs N`` the plan shares the listed runs out to N - 1 worker
processes beside its own, each with its own connection and its own copy of the agents.

The workers are started before anything else runs (no event loop, no database thread):
on Linux they are forked then, so they start in milliseconds with every module already
imported; where forking is not safe (another thread already runs, or the platform does
not fork) they are spawned, which costs an interpreter start and the imports. Each opens
its runtime at once, while the parent lists the runs, then waits for its share.

Shares are balanced by the runs' recorded step counts (replay time grows with them), and
streamed to each worker in chunks of :data:`CHUNK` runs: a worker starts replaying its
first runs while the rest of its share is still being sent, instead of waiting for one
pickle of the whole share (runs with large inputs make that pickle large). A
plan too small to gain from it (fewer than :data:`MIN_SHARED_STEPS` steps in all) is
planned by the parent alone, and the workers are told to stop. Every worker's answer is
checked: the plans of one agent must name one code version (a file saved while the
workers loaded the agents would otherwise mix two versions into one report). A worker's
error reaches the caller as its own class (an unknown agent stays ``AgentNotFound``, a
database failure a ``StorageError``), with a note naming the worker; only an error that
cannot cross a process boundary (it does not pickle) becomes :class:`PlanWorkerFailed`.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import pickle
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from toren.core.contract.records import RunRecord
from toren.core.drivers.plan import plan_listed
from toren.core.drivers.tickstate import TickDeps
from toren.errors import TorenError

# Below this many recorded steps in all, the parent plans alone: a worker's share would
# take less time than handing it over.
MIN_SHARED_STEPS = 2_000
MAX_JOBS = 16
# The default: each process opens its own connections (a PostgreSQL worker process holds
# a few), so the default stays small whatever the machine; --jobs asks for more.
DEFAULT_MAX_JOBS = 4
# Runs per message to a worker: small enough that a worker starts at once, large enough
# that the pipe's per-message cost stays negligible.
CHUNK = 64
CGROUP_ROOT = Path("/sys/fs/cgroup")


class PlanWorkerFailed(TorenError):
    """A plan worker process failed or died: the plan is incomplete."""


def default_jobs(*, cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path | None = None) -> int:
    """The cores this process may use, at most :data:`DEFAULT_MAX_JOBS`: the CPUs it may
    run on (its affinity), capped by a CPU quota of its cgroup (a container limited to
    ``--cpus 2`` on a 64-core host plans with 2 processes, not 4 fighting over 2 cores)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit(cgroup_root, proc_cgroup or Path("/proc/self/cgroup"))
    if quota is not None:
        cores = min(cores, quota)
    return max(1, min(cores, DEFAULT_MAX_JOBS))


def cgroup_cpu_limit(cgroup_root: Path, proc_cgroup: Path) -> int | None:
    """The CPU quota of this process's cgroup in whole cores (rounded up), or None when
    there is none or it cannot be read. cgroup v2 (``cpu.max``: ``"max 100000"`` or
    ``"<quota> <period>"``) is read at the process's own cgroup and every ancestor, the
    smallest limit winning; cgroup v1 (``cpu.cfs_quota_us``, -1 for none) likewise."""
    try:
        lines = proc_cgroup.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2, the unified hierarchy
            limits += _limits_along(cgroup_root, path, _v2_limit)
        elif "cpu" in controllers.split(","):  # v1, mounted as cpu,cpuacct or cpu
            for mount in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
                if (cgroup_root / mount).is_dir():
                    limits += _limits_along(cgroup_root / mount, path, _v1_limit)
                    break
    return min(limits) if limits else None


def _limits_along(mount: Path, path: str, read: Callable[[Path], int | None]) -> list[int]:
    """The limits set on the cgroup at ``path`` and each of its ancestors (inside a
    container the process's own path often does not exist under the mount: its
    namespace's root is then the mount itself, which is read)."""
    found: list[int] = []
    parts = [part for part in path.strip("/").split("/") if part]
    for depth in range(len(parts), -1, -1):
        directory = mount.joinpath(*parts[:depth])
        if directory.is_dir():
            limit = read(directory)
            if limit is not None:
                found.append(limit)
    return found


def _v2_limit(directory: Path) -> int | None:
    try:
        quota, _, period = (directory / "cpu.max").read_text(encoding="utf-8").partition(" ")
        if quota.strip() == "max":
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_limit(directory: Path) -> int | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text(encoding="utf-8"))
        period = int((directory / "cpu.cfs_period_us").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:  # -1: no quota
        return None
    return max(1, math.ceil(quota / period))


class PlanPool:
    """``jobs - 1`` worker processes (see the module docstring); use as a context
    manager around the plan, and pass it to :func:`toren.core.drivers.plan.plan_report` as
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
            answers = [
                asyncio.to_thread(_send_and_answer, process, conn, share)
                for (process, conn), share in zip(self._workers, shares[1:], strict=True)
            ]
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


def _send_and_answer(
    process: object, conn: Connection, share: Sequence[RunRecord]
) -> list[dict[str, object]]:
    """Stream ``share`` to one worker in chunks (it plans them as they arrive), then wait
    for its plans. Runs in a thread: the parent plans its own share meanwhile."""
    try:
        for start in range(0, len(share), CHUNK):
            conn.send(("runs", list(share[start : start + CHUNK])))
        conn.send(("end", None))
    except OSError:  # BrokenPipeError: it died before its share was sent
        raise _died(process) from None
    try:
        kind, value = conn.recv()
    except (EOFError, OSError):
        raise _died(process) from None
    if kind == "error":
        raise _raised_by(process, value)
    plans: list[dict[str, object]] = value
    return plans


def _raised_by(process: Any, value: object) -> BaseException:
    """The worker's error as its own class, noted with the worker it came from; its text
    alone (an error that did not pickle) as :class:`PlanWorkerFailed`."""
    if isinstance(value, BaseException):
        value.add_note(f"(raised in toren plan's worker process {process.pid})")
        return value
    return PlanWorkerFailed(f"a plan worker failed: {value}")


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
            first = await asyncio.to_thread(_receive, conn)
            if first is None:
                return
            if failure is not None:
                await asyncio.to_thread(_drain, conn, first)
                conn.send(("error", _portable(failure)))
                continue
            share = _Share(conn, first)
            try:
                deps = TickDeps(
                    store=runtime.store,
                    agents=runtime.resolver,
                    code_version=runtime.deps.code_version,
                )
                plans = [p.to_dict() for p in await plan_listed(deps, share.runs())]
            except Exception as exc:
                await asyncio.to_thread(share.drain)
                conn.send(("error", _portable(exc)))
            else:
                conn.send(("ok", plans))
    finally:
        if failure is None:
            await close_runtime(runtime)


Message = tuple[str, list[RunRecord] | None]


def _receive(conn: Connection) -> Message | None:
    """The parent's next message: ``("runs", chunk)``, ``("end", None)``, or None when it
    is told to stop or the parent is gone."""
    try:
        message: Message | None = conn.recv()
    except (EOFError, OSError):  # the parent is gone
        return None
    return message


class _Share:
    """One share's runs as the parent streams them, up to its ``end``."""

    def __init__(self, conn: Connection, first: Message) -> None:
        self._conn = conn
        self._next: Message | None = first
        self.ended = first[0] != "runs"

    async def runs(self) -> AsyncIterator[RunRecord]:
        while not self.ended:
            message = self._next
            if message is None:
                raise PlanWorkerFailed("the parent stopped sending this worker's share")
            for run in message[1] or ():
                yield run
            self._next = await asyncio.to_thread(_receive, self._conn)
            self.ended = self._next is None or self._next[0] != "runs"
        if self._next is None:
            raise PlanWorkerFailed("the parent stopped sending this worker's share")

    def drain(self) -> None:
        """Read the rest of a share that will not be planned (up to its ``end``), so the
        parent's sending thread is not left blocked on a full pipe."""
        while not self.ended:
            self._next = _receive(self._conn)
            self.ended = self._next is None or self._next[0] != "runs"


def _drain(conn: Connection, first: Message) -> None:
    _Share(conn, first).drain()


def _portable(exc: BaseException) -> BaseException | str:
    """``exc`` itself when it survives a trip through pickle as the same class (so the
    parent raises what was raised here), else its class and text."""
    try:
        if type(pickle.loads(pickle.dumps(exc))) is type(exc):
            return exc
    except Exception:  # an exception whose __init__ takes other arguments than its args
        pass
    message = exc.message if isinstance(exc, TorenError) else str(exc)
    return f"{type(exc).__name__}: {message}"
