"""Stalled workers start nothing once they thaw (issue 20): fencing before effects.

Real worker processes (tests/core/stall_worker.py) run the `mailer` agent through the
real ``openai`` SDK against a loopback Chat Completions server; its tool appends a line per
email to a file. A worker holding a run is frozen with SIGSTOP past its lease (TTL 2 s),
another worker takes the run over and completes it, and the frozen one is thawed with
SIGCONT. Counted at the server and in the outbox: nothing more after the thaw, and never
a request or an email for a step the log already holds.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.core.stall_worker import NAP, position, recorded, registry
from tests.providers.fakes import Completion, serve_fake_models
from toren.store.sqlite import parse_sqlite_url

ROOT = Path(__file__).parents[2]
TTL, HEARTBEAT = 2.0, 0.5
MODEL_DELAY = 0.4

pytestmark = pytest.mark.slow


class Ledger:
    """What the loopback model server served, per (run tag, step), and every request that
    arrived for a step already in the log (a re-paid call)."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.served: Counter[tuple[str, int]] = Counter()
        self.repaid: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def reply(self, body: dict[str, Any]) -> Completion:
        tag, k = body["messages"][-1]["content"].rsplit(" ", 1)
        kind = "ModelCallRecorded"
        again = recorded(self.db_url, tag, position(tag, int(k), kind), kind)
        with self.lock:
            self.served[(tag, int(k))] += 1
            if again:
                self.repaid.append((tag, int(k)))
        return Completion(text=f"ok {tag} {k}", delay=MODEL_DELAY)

    def requests(self, tag: str) -> int:
        with self.lock:
            return sum(n for (t, _), n in self.served.items() if t == tag)


class Worker:
    def __init__(self, db_url: str, base_url: str, effects: Path, logs: Path, n: int) -> None:
        self.args = [db_url, base_url, str(effects), str(TTL), str(HEARTBEAT)]
        self.log = logs / f"worker-{n}.stderr"
        self.proc: subprocess.Popen[bytes] | None = None
        self.id = ""
        self.spawn()

    def spawn(self) -> None:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"}
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.core.stall_worker", *self.args],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def text(self) -> str:
        with open(self.log) as f:
            f.seek(self.offset)
            return f.read()

    async def ready(self) -> None:
        await until(lambda: "ready " in self.text(), 60, self.alive, "the worker to start")
        line = next(x for x in self.text().splitlines() if x.startswith("ready "))
        self.id = line.split()[1]

    def alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.text()}")

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stopped(self) -> bool:
        """Whether the kernel has stopped the process (SIGSTOP landed)."""
        assert self.proc is not None
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "T"

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


async def until(
    predicate: Callable[[], bool], timeout: float, check: Callable[[], None], what: str
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        check()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)


def effects_of(path: Path, tag: str | None = None) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [x for x in lines if tag is None or x["tag"] == tag]


@contextmanager
def fleet(db_url: str, tmp_path: Path, n: int) -> Iterator[tuple[Ledger, list[Worker], Path]]:
    effects = tmp_path / "outbox.jsonl"
    with serve_fake_models() as fake:
        ledger = Ledger(db_url)
        fake.openai.responder = ledger.reply
        workers = [Worker(db_url, fake.openai_url, effects, tmp_path, i) for i in range(n)]
        try:
            yield ledger, workers, effects
        finally:
            codes = [w.stop() for w in workers]
        # SIGTERM drains and exits 0, even right after a thaw.
        assert codes == [0] * n, [w.text()[-2000:] for w in workers]


def nothing(*_: Any) -> None:
    return None


def run_row_free(db_url: str, run_id: str) -> bool:
    """Whether another session can lock the run's row (SQLite: take the write lock) now.
    A worker frozen inside a commit holds that lock until it thaws, so no other worker can
    take the run over (a stall, not a double effect): the scenario needs the freeze to land
    outside one."""
    if db_url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(parse_sqlite_url(db_url)[0], timeout=0.2, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(db_url) as conn:
        try:
            conn.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE NOWAIT", (run_id,))
            return True
        except psycopg.errors.LockNotAvailable:
            return False
        finally:
            conn.rollback()


async def freeze_outside_a_commit(worker: Worker, db_url: str, run_id: str) -> None:
    while True:
        worker.signal(signal.SIGSTOP)
        await until(worker.stopped, 10, nothing, "SIGSTOP to land")
        if run_row_free(db_url, run_id):
            return
        worker.signal(signal.SIGCONT)
        await asyncio.sleep(0.001)


async def freeze_until_taken_over(store: Any, workers: list[Worker], db_url: str) -> None:
    """Freeze (outside a commit) a worker that holds a running run, and thaw it once another
    worker has taken that run over."""
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "no freeze of a run's holder led to a takeover"
        by_id = {w.id: w for w in workers}
        rows = await store.list_runs(status="running", limit=100)
        held = [(by_id[r.lease_owner], r.id) for r in rows if r.lease_owner in by_id]
        if not held:
            await asyncio.sleep(0.005)
            continue
        holder, run_id = held[0]
        await freeze_outside_a_commit(holder, db_url, run_id)
        row = await store.get_run(run_id)
        if row is None or row.terminal or row.lease_owner != holder.id:
            holder.signal(signal.SIGCONT)  # it let the run go before the freeze landed
            continue
        try:
            while row is not None and row.lease_recoveries == 0:
                assert time.monotonic() < deadline, f"run {run_id} was never taken over"
                await asyncio.sleep(0.05)
                row = await store.get_run(run_id)
        finally:
            holder.signal(signal.SIGCONT)
        return


async def ready_with_runs(
    store: Any, workers: list[Worker], agent: str, inputs: list[dict[str, Any]]
) -> list[Any]:
    """Every worker ready, then a run of ``agent`` started per input."""
    for w in workers:
        await w.ready()
    return [await toren.start_run(store, registry(), agent, input) for input in inputs]


def nothing_twice(ledger: Ledger, effects: Path, tags: list[str], rounds: int) -> None:
    """Every round of every run was requested and emailed, and no request and no email
    came for a step already in the log."""
    emails = Counter((e["tag"], e["k"]) for e in effects_of(effects))
    assert set(emails) == {(t, k) for t in tags for k in range(rounds)}
    assert set(ledger.served) == {(t, k) for t in tags for k in range(rounds)}
    assert ledger.repaid == [], f"requests for steps already recorded: {ledger.repaid}"
    again = [e for e in effects_of(effects) if e["again"]]
    assert again == [], f"emails for steps already recorded: {again}"


async def chaos(rng: random.Random, workers: list[Worker], rounds: int = 10) -> tuple[int, int]:
    """``rounds`` seeded blows, 0.2-0.8 s apart, each at a worker drawn at random: a
    SIGSTOP past the lease TTL then SIGCONT (six in ten), or a SIGKILL and a new process
    in its place. Returns (freezes, kills)."""
    frozen = killed = 0
    for _ in range(rounds):
        await asyncio.sleep(rng.uniform(0.2, 0.8))
        w = rng.choice(workers)
        w.alive()
        if rng.random() < 0.6:
            w.signal(signal.SIGSTOP)
            await asyncio.sleep(TTL + rng.uniform(0.3, 1.5))  # past the lease
            w.signal(signal.SIGCONT)
            frozen += 1
        else:
            w.signal(signal.SIGKILL)
            assert w.proc is not None
            w.proc.wait()
            w.spawn()
            await w.ready()
            killed += 1
    return frozen, killed


async def test_a_stalled_worker_pays_and_sends_nothing_after_it_thaws(
    db_url: str, tmp_path: Path
) -> None:
    """The issue's scenario, 20 seeded times: the freeze lands between steps (in the plain
    ``await`` between the model call and the email) or during one (a model call at the
    server, the email being sent)."""
    rng = random.Random(20261202)
    landed: Counter[str] = Counter()
    store = await toren.connect(db_url)
    try:
        with fleet(db_url, tmp_path, 2) as (ledger, workers, effects):
            for w in workers:
                await w.ready()
            by_id = {w.id: w for w in workers}
            frozen = missed = 0
            while frozen < 20:
                assert missed <= 20, f"{missed} freezes missed their run"
                rep = frozen + missed
                tag = f"r{rep}x{rng.randrange(16**6):06x}"
                run = await toren.start_run(
                    store, registry(), "mailer", {"tag": tag, "steps": 1, "pause": 1.0}
                )
                target = rng.choice(["between", "model", "tool"])

                async def owner(run_id: str = run.id) -> Worker | None:
                    row = await store.get_run(run_id)
                    return by_id.get(row.lease_owner or "") if row else None

                holder: Worker | None = None
                deadline = time.monotonic() + 30
                while holder is None:
                    assert time.monotonic() < deadline, "no worker claimed the run"
                    holder = await owner()
                    await asyncio.sleep(0.005)
                if target == "model":
                    await until(lambda t=tag: ledger.requests(t) >= 1, 30, holder.alive, "call")
                elif target == "tool":
                    await until(
                        lambda t=tag: bool(effects_of(effects, t)), 30, holder.alive, "tool"
                    )
                else:
                    await until(lambda t=tag: ledger.requests(t) >= 1, 30, holder.alive, "call")
                    events = []
                    while not any(e.type == "ModelCallRecorded" for e in events):
                        events = await store.load_events(run.id)
                        await asyncio.sleep(0.005)
                    await asyncio.sleep(rng.uniform(0, 0.8))  # somewhere in the pause
                await freeze_outside_a_commit(holder, db_url, run.id)
                row = await store.get_run(run.id)
                assert row is not None
                if row.terminal or row.lease_owner != holder.id:
                    # A loaded machine let the run finish before the freeze landed: this
                    # one tests nothing. Thaw and draw again (the seed stream goes on).
                    holder.signal(signal.SIGCONT)
                    await toren.wait_for_run(store, run.id, timeout=60)
                    missed += 1
                    continue
                frozen += 1
                events = await store.load_events(run.id)
                steps = sum(e.type.endswith("CallRecorded") for e in events)
                started = ledger.requests(tag) + len(effects_of(effects, tag))
                landed["between" if started == steps else "during"] += 1

                # The other worker takes the run over once the lease runs out, and completes it.
                final = await toren.wait_for_run(store, run.id, timeout=60)
                assert final.status == "completed", final.error
                assert final.output == {"replies": [f"ok {tag} 0"]}
                before = (ledger.requests(tag), len(effects_of(effects, tag)))
                text_before = len(holder.text())

                holder.signal(signal.SIGCONT)
                try:
                    await until(
                        lambda h=holder, r=run.id, n=text_before: (
                            f"tick of run {r} ended" in h.text()[n:]
                        ),
                        30,
                        holder.alive,
                        "the thawed worker to give the run up",
                    )
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; its log:\n{holder.text()[-3000:]}") from None
                after = (ledger.requests(tag), len(effects_of(effects, tag)))
                assert after == before, f"rep {rep} ({target}): {before} -> {after} after the thaw"
                # In flight when frozen: at most that one step again, never a recorded one.
                assert 1 <= after[0] <= 2 and 1 <= after[1] <= 2 and sum(after) <= 3
                assert ledger.repaid == []
                assert not [e for e in effects_of(effects) if e["again"]]
                events = await store.load_events(run.id)
                recorded_steps = [(e.type, e.position) for e in events if e.digest]
                assert recorded_steps == [("ModelCallRecorded", 0), ("ToolCallRecorded", 1)]
                # Two workers wrote the log, the thawed one fenced out: the chain holds
                # (docs/event-log.md#the-chain).
                report = await toren.verify_run(store, run.id)
                assert report.ok and report.chain.linked == len(events), report.to_dict()
    finally:
        await store.close()
    # The seeded freezes landed in both places the issue names.
    assert landed["between"] >= 3 and landed["during"] >= 3, landed


async def test_a_fleet_with_freezes_and_kills_never_repays_or_resends(
    db_url: str, tmp_path: Path
) -> None:
    """3 workers, 30 runs of 3 model calls and 3 emails each, seeded SIGSTOP/SIGCONT past
    the lease TTL mixed with SIGKILLs (a killed worker is restarted). Per recorded step:
    no request and no email after the step was in the log."""
    rng = random.Random(30)
    store = await toren.connect(db_url)
    try:
        with fleet(db_url, tmp_path, 3) as (ledger, workers, effects):
            inputs = [{"tag": f"f{i:02d}", "steps": 3, "pause": 0.2} for i in range(30)]
            runs = await ready_with_runs(store, workers, "mailer", inputs)
            # The first freeze is made to take a run over, whatever the machine's load: a
            # seeded freeze may find its worker idle (the runs done) or land inside a SQLite
            # commit, which holds every other worker off until the thaw.
            await freeze_until_taken_over(store, workers, db_url)
            frozen, killed = await chaos(rng, workers)
            assert frozen + 1 >= 3 and killed >= 2
            for run in runs:
                final = await toren.wait_for_run(store, run.id, timeout=120)
                assert final.status == "completed", final.error
        tags = [f"f{i:02d}" for i in range(30)]
        nothing_twice(ledger, effects, tags, rounds=3)
        recoveries = 0
        for run in runs:
            events = await store.load_events(run.id)
            steps = [(e.type, e.position) for e in events if e.digest]
            assert steps == [
                (kind, 2 * k + (kind == "ToolCallRecorded"))
                for k in range(3)
                for kind in ("ModelCallRecorded", "ToolCallRecorded")
            ]
            final = await store.get_run(run.id)
            assert final is not None
            recoveries += final.lease_recoveries
        assert recoveries >= 1  # the chaos did take runs over
    finally:
        await store.close()


async def test_a_fleet_holding_parked_runs_in_its_caches_never_repays_or_resends(
    db_url: str, tmp_path: Path
) -> None:
    """The same chaos with the sticky cache holding runs (issue 39): 3 workers, 20 runs of
    the napper, 3 rounds each of a model call, an email and a durable nap. Every nap parks
    the run; the worker that parked it keeps it and continues it in place when its timer
    fires, unless a takeover, a kill or another worker's claim came first (then it
    replays). Seeded SIGSTOP past the lease and SIGKILL. Per recorded step: no request and
    no email after it was in the log. And the caches did continue runs in place (each
    worker process prints its counts as they change), so the blows met kept runs, not
    only live ones."""
    rng = random.Random(39)
    store = await toren.connect(db_url)
    tags = [f"{NAP}{i:02d}" for i in range(20)]
    try:
        with fleet(db_url, tmp_path, 3) as (ledger, workers, effects):
            inputs = [{"tag": tag, "steps": 3, "nap": 0.3} for tag in tags]
            runs = await ready_with_runs(store, workers, "napper", inputs)
            frozen, killed = await chaos(rng, workers)
            assert frozen >= 3 and killed >= 2
            for run in runs:
                final = await toren.wait_for_run(store, run.id, timeout=120)
                assert final.status == "completed", final.error
                assert final.output == {"replies": [f"ok {run.input['tag']} {k}" for k in range(3)]}
        # Each worker process's last count (killed ones' too: their logs keep it).
        last: dict[str, int] = {}
        for w in workers:
            for line in w.log.read_text().splitlines():
                if line.startswith("sticky pid="):
                    fields = dict(item.split("=") for item in line.split()[1:])
                    last[fields["pid"]] = int(fields["continued"])
        continued = sum(last.values())
        assert continued >= 1, "no worker continued a kept run: the cache was never exercised"
        nothing_twice(ledger, effects, tags, rounds=3)
        for run, tag in zip(runs, tags, strict=True):
            events = await store.load_events(run.id)
            kinds = ("ModelCallRecorded", "ToolCallRecorded")
            steps = [(e.type, e.position) for e in events if e.type in kinds]
            assert steps == [(kind, position(tag, k, kind)) for k in range(3) for kind in kinds]
            report = await toren.verify_run(store, run.id)
            assert report.ok, report.to_dict()
    finally:
        await store.close()
