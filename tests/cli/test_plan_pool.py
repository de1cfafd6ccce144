"""``toren plan --jobs``: the runs shared out to worker processes (forked, or spawned)
give the very plan one process gives, on both backends; a worker that dies or cannot open
the database fails the plan with a clear error instead of leaving runs out."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.cli.conftest import CHAIN
from toren.cli import plan_pool
from toren.cli._common import NoDatabase
from toren.cli.plan_pool import (
    DEFAULT_MAX_JOBS,
    PlanPool,
    PlanWorkerFailed,
    _one_version_per_agent,
    _portable,
    default_jobs,
    share_out,
)
from toren.core.contract.records import RunRecord
from toren.core.drivers.plan import plan_report
from toren.errors import AgentNotFound, TorenError
from toren.runtime import close_runtime, open_runtime

RUNS = 7


@pytest.fixture
def project(tmp_path: Path, db_url: str) -> tuple[Path, str]:
    """The chain agent with RUNS runs waiting for a message after two model steps."""
    root = tmp_path / "agents"
    shutil.copytree(CHAIN, root / "chain")

    async def fill() -> None:
        runtime = await open_runtime(root, db_url)
        try:
            for i in range(RUNS):
                run = await toren.start_run(
                    runtime.store, runtime.resolver, "chain", {"ask": True, "i": i}
                )
                assert (await toren.tick(run.id, runtime.deps)).status == "waiting"
        finally:
            await close_runtime(runtime)

    asyncio.run(fill())
    return root, db_url


def _report(root: Path, url: str, pool: PlanPool | None) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        runtime = await open_runtime(root, url)
        try:
            return await plan_report(runtime.store, runtime.resolver, limit=100, shards=pool)
        finally:
            await close_runtime(runtime)

    report = asyncio.run(go())
    report.pop("elapsed_ms")
    return report


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_shared_out_plans_equal_the_plan_of_one_process(
    project: tuple[Path, str], method: str
) -> None:
    root, url = project
    alone = _report(root, url, None)
    assert alone["runs"] == RUNS and alone["invalidated"] == 0
    with PlanPool(3, root, url, None, min_shared_steps=1, method=method) as pool:
        assert _report(root, url, pool) == alone
    assert sorted(pool.planned) == [2, 2, 3]  # each process planned its share

    # An edited prompt: every run is invalidated from step 1, said the same way.
    (root / "chain" / "prompts" / "step1.md").write_text("An edited prompt.\n", encoding="utf-8")
    alone = _report(root, url, None)
    assert alone["invalidated"] == RUNS
    assert {f["from_pos"] for p in alone["plans"] for f in p["findings"]} == {1}
    with PlanPool(3, root, url, None, min_shared_steps=1, method=method) as pool:
        assert _report(root, url, pool) == alone


def test_a_small_plan_stays_in_one_process(project: tuple[Path, str]) -> None:
    root, url = project
    with PlanPool(2, root, url, None) as pool:  # 14 steps, far below the threshold
        (worker, _), *_ = pool._workers
        assert _report(root, url, pool)["runs"] == RUNS
    assert pool.planned == []  # nothing shared out
    assert worker.exitcode == 0  # told to stop, never given runs


def test_a_dead_worker_fails_the_plan(project: tuple[Path, str]) -> None:
    root, url = project
    with PlanPool(2, root, url, None, min_shared_steps=1) as pool:
        (worker, _), *_ = pool._workers
        os.kill(worker.pid, signal.SIGKILL)
        worker.join()
        with pytest.raises(PlanWorkerFailed, match=r"exited \(code -9\).*--jobs 1"):
            _report(root, url, pool)


def test_a_worker_that_cannot_open_the_database_says_why(
    project: tuple[Path, str], tmp_path: Path
) -> None:
    root, url = project
    missing = f"sqlite:///{tmp_path}/nowhere/toren.db"
    with (
        PlanPool(2, root, missing, None, min_shared_steps=1) as pool,
        pytest.raises(TorenError, match="nowhere") as raised,
    ):
        _report(root, url, pool)
    # The worker's own error, of its own class (not folded into PlanWorkerFailed), with
    # a note naming the worker process it came from.
    assert type(raised.value) is NoDatabase
    assert any("worker process" in note for note in raised.value.__notes__)


def test_an_unpicklable_worker_error_is_said_in_text() -> None:
    class Odd(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"odd {a} {b}")

    said = _portable(Odd(1, 2))
    assert said == "Odd: odd 1 2"
    kept = _portable(AgentNotFound("nope"))
    assert type(kept) is AgentNotFound


def test_shares_stream_in_chunks(
    project: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A share larger than one chunk reaches the worker over several messages and is
    planned whole: the plan equals one process's."""
    root, url = project
    alone = _report(root, url, None)
    monkeypatch.setattr(plan_pool, "CHUNK", 1)
    with PlanPool(2, root, url, None, min_shared_steps=1, method="fork") as pool:
        assert _report(root, url, pool) == alone
    assert sum(pool.planned) == RUNS and min(pool.planned) >= 3  # several chunks each


def _cgroup(tmp_path: Path, own: str, limits: dict[str, str], v1: bool = False) -> int:
    root = tmp_path / "cgroup"
    for where, text in limits.items():
        directory = root / where
        directory.mkdir(parents=True, exist_ok=True)
        if v1:
            quota, period = text.split()
            (directory / "cpu.cfs_quota_us").write_text(quota + "\n")
            (directory / "cpu.cfs_period_us").write_text(period + "\n")
        else:
            (directory / "cpu.max").write_text(text + "\n")
    proc = tmp_path / "proc-cgroup"
    line = f"4:cpu,cpuacct:{own}" if v1 else f"0::{own}"
    proc.write_text(f"{line}\n")
    return default_jobs(cgroup_root=root, proc_cgroup=proc)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux affinity")
def test_default_jobs_respects_a_cgroup_cpu_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert _cgroup(tmp_path / "a", "/", {"": "max 100000"}) == DEFAULT_MAX_JOBS
    assert _cgroup(tmp_path / "b", "/", {"": "150000 100000"}) == 2  # 1.5 cores: 2
    assert _cgroup(tmp_path / "c", "/", {"": "50000 100000"}) == 1
    # A limit on an ancestor binds its descendants; the smallest along the path wins.
    assert _cgroup(tmp_path / "d", "/k/pod", {"k": "300000 100000", "k/pod": "max 100000"}) == 3
    assert _cgroup(tmp_path / "e", "/k/pod", {"k": "300000 100000", "k/pod": "100000 100000"}) == 1
    # Inside a container the own path may not exist under the mount: its root is read.
    assert _cgroup(tmp_path / "f", "/system.slice/x", {"": "200000 100000"}) == 2
    # cgroup v1.
    assert _cgroup(tmp_path / "g", "/", {"cpu,cpuacct": "200000 100000"}, v1=True) == 2
    assert _cgroup(tmp_path / "h", "/", {"cpu,cpuacct": "-1 100000"}, v1=True) == 4
    # Nothing readable: the affinity alone.
    missing = default_jobs(cgroup_root=tmp_path / "none", proc_cgroup=tmp_path / "none")
    assert missing == DEFAULT_MAX_JOBS


def _run(run_id: str, steps: int) -> RunRecord:
    return RunRecord(run_id, "a", "main", "waiting", None, steps=steps)


def test_shares_are_balanced_and_keep_the_listing_order() -> None:
    runs = [_run(f"r{i}", steps) for i, steps in enumerate([40, 1, 1, 38, 2, 20, 20, 0])]
    shares = share_out(runs, 3)
    assert sorted(r.id for share in shares for r in share) == sorted(r.id for r in runs)
    for share in shares:
        assert [runs.index(r) for r in share] == sorted(runs.index(r) for r in share)
    loads = sorted(sum(max(r.steps, 1) for r in share) for share in shares)
    assert loads == [41, 41, 41]  # 123 steps in all (an empty run counts as 1)


def test_two_code_versions_of_one_agent_fail_the_plan() -> None:
    plan = {"agent": "a", "process": "main", "problem": None, "code_version": "v1"}
    _one_version_per_agent([plan, plan, {**plan, "agent": "b", "code_version": "v2"}])
    with pytest.raises(PlanWorkerFailed, match="changed while it was planned"):
        _one_version_per_agent([plan, {**plan, "code_version": "v2"}])


def test_a_failing_share_here_stops_the_workers(project: tuple[Path, str]) -> None:
    """When this process's own share fails, the workers are stopped at once: the error is
    raised without waiting for shares nobody will read."""
    root, url = project

    async def go(pool: PlanPool) -> None:
        runtime = await open_runtime(root, url)

        async def broken(runs: Any) -> Any:
            raise RuntimeError("this share failed")

        try:
            listed = await runtime.store.list_runs(status="waiting", limit=100)
            await pool.plan(listed, broken)
        finally:
            await close_runtime(runtime)

    with PlanPool(2, root, url, None, min_shared_steps=1) as pool:
        (worker, _), *_ = pool._workers
        with pytest.raises(RuntimeError, match="this share failed"):
            asyncio.run(go(pool))
        worker.join(timeout=30)
        assert worker.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_exit_when_their_parent_is_killed(tmp_path: Path, method: str) -> None:
    """A parent killed outright (SIGKILL: no __exit__, no atexit) leaves no worker behind:
    each worker's pipe reports it gone, so none waits for work forever."""
    root = tmp_path / "agents"
    shutil.copytree(CHAIN, root / "chain")
    url = f"sqlite:///{tmp_path}/toren.db"
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from toren.cli.plan_pool import PlanPool\n"
        f"pool = PlanPool(3, Path({str(root)!r}), {url!r}, None, method={method!r})\n"
        "pool.__enter__()\n"
        "print(' '.join(str(p.pid) for p, _ in pool._workers), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 2
    # Orphans are reparented, so they cannot be waited for: their state is polled until
    # they are gone (a bound against a hang, not a measure of speed).
    give_up = time.monotonic() + 120
    while any(map(_alive, pids)) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert not any(map(_alive, pids)), "plan workers outlived their killed parent"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
