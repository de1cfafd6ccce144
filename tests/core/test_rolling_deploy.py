"""Rolling deploys with real worker processes on PostgreSQL, and the invalidation storm
the guard prevents."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.conftest import clone_pg_database, drop_pg_database, pg_url, require_pg
from tests.core.deploy_worker import CHANGED_STEP, CHILD_STEPS, MAIN_STEPS, registry
from toren.config import LeaseSettings
from toren.providers.scripted import ScriptedProvider, read_ledger
from toren.store import Store
from toren.store.base import WorkerInfo

ROOT = Path(__file__).parents[2]
RUNS = 20


def spawn_worker(
    url: str, version: str, ledger: Path, go: Path | None = None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "tests.core.deploy_worker", url, version, str(ledger), "0.15"]
    with open(ledger.with_suffix(".log"), "ab") as log:
        return subprocess.Popen(
            [*argv, *([str(go)] if go else [])],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )


async def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def served(ledgers: list[Path]) -> Counter[str]:
    return Counter(line["last_user"] for path in ledgers for line in read_ledger(path))


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        assert p.wait(timeout=60) == 0


@pytest.fixture
def pg_db() -> Any:
    require_pg()
    name = clone_pg_database("toren_deploy")
    try:
        yield pg_url(name)
    finally:
        drop_pg_database(name)


@pytest.mark.slow
@pytest.mark.parametrize(("old", "new"), [("A", "B"), ("B", "A")], ids=["deploy", "rollback"])
async def test_rolling_deploy(pg_db: str, tmp_path: Path, old: str, new: str) -> None:
    store = await toren.connect(pg_db)
    try:
        runs = [
            await toren.start_run(store, registry(old), "deploy", {"id": i}) for i in range(RUNS)
        ]
        old_ledgers = [tmp_path / f"{old}{i}.jsonl" for i in range(2)]
        new_ledgers = [tmp_path / f"{new}{i}.jsonl" for i in range(2)]
        # The new version's processes start first and wait, imported and connected, for
        # `go`: their start-up time must not decide whether the two versions overlap.
        go = tmp_path / "go"
        news = [spawn_worker(pg_db, new, path, go) for path in new_ledgers]
        olds: list[subprocess.Popen[bytes]] = []
        try:
            await wait_for(
                lambda: len(list(tmp_path.glob("go.ready.*"))) == len(news),
                120,
                "the new version's workers to be ready",
            )
            olds = [spawn_worker(pg_db, old, path) for path in old_ledgers]
            # The old version gets half the runs past the step the new version changes...
            await wait_for(
                lambda: (
                    sum(
                        1 for k in served(old_ledgers) if k.endswith(f"step {CHANGED_STEP} [{old}]")
                    )
                    >= RUNS // 2
                ),
                60,
                "old workers to get going",
            )
            go.touch()
            # ...both versions overlap for a while, then the old one is drained.
            await wait_for(
                lambda: sum(served(new_ledgers).values()) >= 20, 60, "new workers to take over"
            )
            assert any(p.poll() is None for p in olds)  # a real overlap: old workers still live
            stop(olds)
            await _finish(store, runs, news)
        finally:
            for p in olds + news:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        finals = [await store.get_run(r.id) for r in runs]

        counts = served(old_ledgers + new_ledgers)
        by_new = 0
        for run, final in zip(runs, finals, strict=True):
            assert final is not None and final.status == "completed", final
            i = run.input["id"]
            events = await store.load_events(run.id)
            changed = final.output["replies"][CHANGED_STEP]
            if changed == f"ok run {i} step {CHANGED_STEP} [{old}]":
                # Finished whole by the old version (on a slow machine the new workers take
                # seconds to start): legitimate only if the new version never wrote in it,
                # since the guard keeps old workers off a stream the new version changed.
                assert not [e for e in events if e.code_version == new], changed
            else:
                # Completed under the new code: the changed step carries the new prompt.
                assert changed == f"ok run {i} step {CHANGED_STEP} [{new}]"
                by_new += 1
            per_stream = Counter(e.stream for e in events if e.type == "StreamInvalidated")
            assert all(n <= 1 for n in per_stream.values()), per_stream
            assert set(per_stream) <= {"main"}  # the child stream was never disputed
            # Nothing that the new code did not change was paid twice.
            for j in range(CHILD_STEPS):
                assert counts[f"run {i} research {j}"] == 1
            for k in range(CHANGED_STEP):
                assert counts[f"run {i} step {k}"] == 1
            for k in range(CHANGED_STEP + 1, MAIN_STEPS):
                assert counts[f"run {i} step {k}"] <= 2  # once per version at most
        invalidated = sum(await count_invalidations(store, [r.id for r in runs]))
        assert invalidated >= 1  # the overlap really disputed some streams
        assert by_new >= 1  # and the new version finished the runs it took over
    finally:
        await store.close()


async def _finish(store: Store, runs: list[Any], news: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 120
    while True:
        finals = [await store.get_run(r.id) for r in runs]
        if all(f is not None and f.terminal for f in finals):
            break
        assert time.monotonic() < deadline, [f.status for f in finals if f]
        await asyncio.sleep(0.1)
    stop(news)


# -- the storm --------------------------------------------------------------------------


def storm_registry(version: str) -> toren.Registry:
    async def agent(ctx: toren.Context, input: Any) -> Any:
        for i in range(4):
            marker = f" [{version}]" if i == 2 else ""
            await ctx.model(
                "scripted:echo", [{"role": "user", "content": f"{input} step {i}{marker}"}]
            )
        while True:
            await ctx.sleep(60)  # in flight forever: both versions keep coming back to it

    reg = toren.Registry()
    reg.add("storm", agent, code_version=version)
    return reg


async def alternate(
    store: Store, *, guard: bool, rounds: int = 30
) -> tuple[list[str], Counter[str]]:
    """Two live versions take turns on the same runs, one tick each per simulated minute.
    B's workers started after A's, so B is the current deploy."""
    clock = toren.ManualClock(1_950_000_000.0)
    workers = {"A": ("wa", clock.now()), "B": ("wb", clock.now() + 1)}
    for version, (wid, started) in workers.items():
        await store.register_worker(WorkerInfo(wid, version, started, started))
    provider = ScriptedProvider()
    base = toren.Settings(
        lease=LeaseSettings(ttl=30, heartbeat=5), storm_guard=guard, drain_window=30
    )
    deps = {
        v: toren.TickDeps(
            store=store,
            agents=storm_registry(v),
            providers={"scripted": provider},
            clock=clock,
            settings=base,
            worker_id=workers[v][0],
            worker_started_at=workers[v][1],
        )
        for v in ("A", "B")
    }
    run_ids = [
        (await toren.start_run(store, storm_registry("A"), "storm", f"r{i}", clock=clock)).id
        for i in range(3)
    ]
    statuses: Counter[str] = Counter()
    for round_ in range(rounds):
        version = "AB"[round_ % 2]
        for wid, _ in workers.values():
            await store.heartbeat_worker(wid, now=clock.now(), draining=False)
        for run_id in run_ids:
            statuses[(await toren.tick(run_id, deps[version])).status] += 1
        await clock.advance(61)
    return run_ids, statuses


async def count_invalidations(store: Store, run_ids: list[str]) -> list[int]:
    return [
        sum(1 for e in await store.load_events(r) if e.type == "StreamInvalidated") for r in run_ids
    ]


async def test_without_the_guard_versions_fight(store: Store) -> None:
    run_ids, _ = await alternate(store, guard=False)
    per_run = await count_invalidations(store, run_ids)
    assert all(n >= 20 for n in per_run), per_run  # the storm: every other tick invalidates


async def test_with_the_guard_at_most_one_invalidation_per_stream(store: Store) -> None:
    run_ids, statuses = await alternate(store, guard=True)
    per_run = await count_invalidations(store, run_ids)
    assert all(n <= 1 for n in per_run), per_run
    assert statuses["backed_off"] >= 1  # the old version stepped aside...
    for run_id in run_ids:  # ...and the newest deploy's prompt is what the stream holds
        run = await store.get_run(run_id)
        assert run is not None and run.status == "waiting" and run.code_version == "B"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def test_a_backing_off_worker_says_so_in_metrics_and_logs(store: Store) -> None:
    """The guard's decision is visible: a log line naming the newer version, and the
    worker's backoff counter in GET /metrics."""
    from toren.api.metrics import render

    clock = toren.ManualClock(1_960_000_000.0)
    await store.register_worker(WorkerInfo("wb", "B", clock.now() + 1, clock.now()))
    provider = ScriptedProvider()
    settings = toren.Settings(
        lease=LeaseSettings(ttl=30, heartbeat=0.05), drain_window=30, poll_interval=0.05
    )
    b = toren.TickDeps(
        store=store,
        agents=storm_registry("B"),
        providers={"scripted": provider},
        clock=clock,
        settings=settings,
    )
    run = await toren.start_run(store, storm_registry("B"), "storm", "r", clock=clock)
    assert (await toren.tick(run.id, b)).status == "waiting"  # B wrote the stream
    await clock.advance(61)
    # B's workers are the current deploy: started after the A worker below.
    await store.register_worker(WorkerInfo("wb", "B", clock.now() + 5, clock.now()))
    a = toren.TickDeps(
        store=store,
        agents=storm_registry("A"),
        providers={"scripted": provider},
        clock=clock,
        settings=settings,
        worker_id="wa",
    )
    worker = toren.LocalWorkerRuntime(a)
    # A handler of our own: the CLI tests configure the "toren" logger in this process
    # (no propagation), so pytest's caplog would not see the line in a whole-suite run.
    records = _Records()
    tick_log = logging.getLogger("toren.tick")
    level, disabled = tick_log.level, tick_log.disabled
    tick_log.setLevel(logging.WARNING)  # the CLI tests may have raised "toren" to ERROR
    # and a dictConfig elsewhere in this process (uvicorn's) may have disabled the logger.
    tick_log.disabled = False
    tick_log.addHandler(records)
    try:
        async with worker:
            deadline = time.monotonic() + 10
            while worker.metrics.backoffs == 0:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
    finally:
        tick_log.removeHandler(records)
        tick_log.setLevel(level)
        tick_log.disabled = disabled
    assert any("backs off run" in m and "newer live code version B" in m for m in records.messages)
    text = render(await store.stats(), worker)
    assert "toren_worker_backoffs_total 1" in text
    assert (await count_invalidations(store, [run.id])) == [0]
