"""Crash recovery with real processes: a worker running a 50-step run is killed with
SIGKILL at random (seeded) points, at least 20 times, and restarted each time. The run
completes with the same output as an uninterrupted run, and the provider's ledger shows
every model call paid once, plus at most one repeat per kill (the step in flight)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import toren
from tests.core.crash_worker import STEPS, registry
from toren.providers.scripted import read_ledger

ROOT = Path(__file__).parents[2]
KILLS = 20


def spawn(url: str, ledger: Path, run_id: str, latency: float = 0.01) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(ledger.with_suffix(".stderr"), "ab") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.core.crash_worker",
                url,
                str(ledger),
                run_id,
                str(latency),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def stderr_of(ledger: Path) -> str:
    path = ledger.with_suffix(".stderr")
    return path.read_text()[-3000:] if path.exists() else ""


def distinct_steps(ledger: Path) -> int:
    return len({line["last_user"] for line in read_ledger(ledger)})


async def wait_until(predicate, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"worker exited early with {proc.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the worker to make progress")
        await asyncio.sleep(0.005)


@pytest.mark.slow
async def test_sigkill_twenty_times(db_url: str, tmp_path: Path) -> None:
    rng = random.Random(20261201)
    store = await toren.connect(db_url)
    try:
        run = await toren.start_run(store, registry(), "fifty")
        ledger = tmp_path / "ledger.jsonl"
        targets = sorted(rng.sample(range(1, STEPS - 1), KILLS))
        for target in targets:
            proc = spawn(db_url, ledger, run.id)
            await wait_until(lambda t=target: distinct_steps(ledger) >= t, 60, proc)
            # Jitter: die before, during or after the commit of the step in flight.
            await asyncio.sleep(rng.uniform(0, 0.012))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        kills = len(targets)
        proc = spawn(db_url, ledger, run.id)
        assert proc.wait(timeout=120) == 0, stderr_of(ledger)

        final = await store.get_run(run.id)
        assert final is not None and final.status == "completed"
        expected = {"answers": [f"ok step {i}" for i in range(STEPS)]}
        assert final.output == expected  # same as an uninterrupted run
        assert final.lease_recoveries >= 1

        served = Counter(line["last_user"] for line in read_ledger(ledger))
        assert set(served) == {f"step {i}" for i in range(STEPS)}
        repeats = sum(n - 1 for n in served.values())
        assert repeats <= kills, f"{repeats} repeated calls for {kills} kills: {served}"
        events = await store.load_events(run.id)
        recorded = [e.position for e in events if e.type == "ModelCallRecorded"]
        assert sorted(recorded) == list(range(STEPS))  # every completed call exactly once
    finally:
        await store.close()


async def test_uninterrupted_reference_run(tmp_path: Path) -> None:
    """The reference the crash test compares with, computed by actually running."""
    store = await toren.connect(f"sqlite:///{tmp_path}/ref.db")
    try:
        run = await toren.start_run(store, registry(), "fifty")
        proc = spawn(f"sqlite:///{tmp_path}/ref.db", tmp_path / "l.jsonl", run.id, latency=0)
        assert proc.wait(timeout=60) == 0, stderr_of(tmp_path / "l.jsonl")
        final = await store.get_run(run.id)
        assert final is not None
        assert final.output == {"answers": [f"ok step {i}" for i in range(STEPS)]}
        assert len(read_ledger(tmp_path / "l.jsonl")) == STEPS
    finally:
        await store.close()
