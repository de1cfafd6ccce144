"""Schedules across a fleet of real worker processes on PostgreSQL: every nominal time
of a one-second schedule starts exactly one run while workers are SIGKILLed at random
moments, and two deploys that define the same schedule differently never fire one time
twice (the newest deploy's definition wins)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import pg_url
from toren.store import connect

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.slow


def _start(url: str, version: str, spec: dict[str, Any]) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.core.schedule_worker", url, version, json.dumps(spec)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def _nominal(url: str) -> list[tuple[float, Any]]:
    """Every scheduled run's (nominal time, input), in nominal order."""

    async def read() -> list[tuple[float, Any]]:
        store = await connect(url)
        try:
            found = []
            for run_id, _, at in await store.schedules.runs_of("tick/beat", limit=10_000):
                run = await store.get_run(run_id)
                assert run is not None and at is not None
                found.append((at, run.input))
            return sorted(found, key=lambda item: item[0])
        finally:
            await store.close()

    return asyncio.run(read())


def _wait_for(url: str, count: int, timeout: float = 120) -> list[tuple[float, Any]]:
    """Every scheduled run once ``count`` have started: polled every 100 ms through one
    store kept open meanwhile (a connection per poll cost more CPU than the fleet)."""

    async def wait() -> None:
        store = await connect(url)
        try:
            deadline = time.monotonic() + timeout
            while (
                started := len(await store.schedules.runs_of("tick/beat", limit=10_000))
            ) < count:
                assert time.monotonic() < deadline, f"only {started} of {count} runs started"
                await asyncio.sleep(0.1)
        finally:
            await store.close()

    asyncio.run(wait())
    return _nominal(url)


def _kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.stdout is not None
    process.stdout.close()


def _stop(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()


def _migrate(url: str) -> None:
    async def go() -> None:
        await (await connect(url)).close()

    asyncio.run(go())


EVERY_SECOND = {"every": 1, "overlap": "allow_all", "catch_up": "all", "catch_up_window": 3600}


def _drop_connections(url: str) -> int:
    """Terminate every connection to the database (the workers' pools, listeners): a
    database that drops its connections mid-statement."""
    import psycopg

    database = url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url("postgres"), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchall()
    return len(rows)


def test_three_workers_fire_each_second_once_while_killed(pg_only_url: str) -> None:
    """Every few firings, a random worker is SIGKILLed (and a new one started) or every
    connection to the database is dropped, alternately."""
    pg = pg_only_url
    _migrate(pg)
    rng = random.Random(os.urandom(8))
    workers = [_start(pg, "v1", EVERY_SECOND) for _ in range(3)]
    kills = drops = 0
    try:
        seen = len(_wait_for(pg, 1))
        while seen < 62:
            # After a random number of new firings (1 to 4): the moment falls anywhere
            # in a worker's look, including between its decision and its commit.
            seen = len(_wait_for(pg, seen + rng.randint(1, 4)))
            if (kills + drops) % 2:
                drops += _drop_connections(pg) > 0
                continue
            victim = rng.randrange(len(workers))
            _kill(workers[victim])
            kills += 1
            workers[victim] = _start(pg, "v1", EVERY_SECOND)
    finally:
        _stop(workers)
    fired = [at for at, _ in _nominal(pg)]
    assert kills >= 5 and drops >= 5
    assert len(fired) == len(set(fired)), "a nominal time started two runs"
    # No gap: every second from the first to the last fired exactly once.
    assert fired == [fired[0] + i for i in range(len(fired))]
    assert len(fired) >= 60


def test_two_deploys_never_fire_one_time_twice(pg_only_url: str) -> None:
    """v1 fires every 2 s; v2, started later with every 3 s, takes the schedule over
    while v1's worker keeps running and firing what the row says."""
    pg = pg_only_url
    _migrate(pg)
    spec = {"overlap": "allow_all", "catch_up": "all", "catch_up_window": 3600}
    old = _start(pg, "v1", {**spec, "every": 2})
    workers = [old]
    try:
        before = len(_wait_for(pg, 3))
        workers.append(_start(pg, "v2", {**spec, "every": 3}))
        _wait_for(pg, before + 6)
        assert old.poll() is None  # the old deploy's worker was running all along
    finally:
        _stop(workers)
    runs = _nominal(pg)
    fired = [at for at, _ in runs]
    assert len(fired) == len(set(fired)), "a nominal time started two runs"
    versions = [run_input["v"] for _, run_input in runs]
    switch = versions.index("v2")
    assert set(versions[switch:]) == {"v2"}, "the old definition fired after the new one"
    assert all(at % 2 == 0 for at in fired[:switch])
    assert all(at % 3 == 0 for at in fired[switch:])
    assert len(fired) - switch >= 5
