"""Concurrency keys across a fleet: 300 runs over 20 keys with a limit of 2 per key, three
worker processes on PostgreSQL (one on SQLite) SIGKILLed at random meanwhile, or one
SIGSTOPped past its lease while it holds slots. A loopback server that the runs' tool
calls counts, per key, how many calls are in progress at once: never more than 2, and
every run completes (a killed or frozen worker's slots come back when its leases run out)."""

from __future__ import annotations

import asyncio
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

import toren
from tests.core.flow_worker import registry

ROOT = Path(__file__).parents[2]
RUNS, KEYS, LIMIT = 300, 20, 2
pytestmark = pytest.mark.slow


class Desk:
    """What the loopback server saw: calls in progress per key, the most at once, the
    calls served to the end per run, and every call as (key, run, pid, start, end,
    when its tool began by the wall clock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.calls: list[tuple[str, str, int, float, float, float]] = []

    def peaks(self, leaving_out: Any = lambda call: False) -> Counter[str]:
        """The most calls in progress at once per key, from the calls' times, without
        those ``leaving_out`` picks."""
        edges = sorted(
            (t, +1 if start else -1, key)
            for key, run, pid, t0, t1, tool in self.calls
            if not leaving_out((key, run, pid, t0, t1, tool))
            for t, start in ((t0, True), (t1, False))
        )
        now: Counter[str] = Counter()
        most: Counter[str] = Counter()
        for _, step, key in edges:  # an end sorts before a start at the same instant
            now[key] += step
            most[key] = max(most[key], now[key])
        return most


def serve(desk: Desk) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            query = parse_qs(urlsplit(self.path).query)
            key, run, pid = query["key"][0], query["run"][0], int(query["pid"][0])
            tool_began = float(query["began"][0])
            began = time.monotonic()
            with desk.lock:
                desk.active[key] += 1
                desk.peak[key] = max(desk.peak[key], desk.active[key])
            try:
                # 50 ms of "work", cut short when the caller is gone (its worker was
                # killed): a dead call is no longer in progress.
                gone = _wait_or_gone(self.connection, 0.05)
                if not gone:
                    body = b'{"ok": true}'
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    with desk.lock:
                        desk.finished[run] += 1
            finally:
                with desk.lock:
                    desk.active[key] -= 1
                    desk.calls.append((key, run, pid, began, time.monotonic(), tool_began))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _wait_or_gone(conn: socket.socket, seconds: float) -> bool:
    readable, _, _ = select.select([conn], [], [], seconds)
    if not readable:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _worker(url: str, server: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.core.flow_worker", url, server],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def _end(process: subprocess.Popen[str], sig: int) -> None:
    process.send_signal(sig)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    assert process.stdout is not None
    process.stdout.close()


async def _start(url: str, server: str) -> list[str]:
    store = await toren.connect(url)
    try:
        reg = registry(server)
        return [
            (await toren.start_run(store, reg, "job", {"key": f"k{i % KEYS}", "i": i})).id
            for i in range(RUNS)
        ]
    finally:
        await store.close()


class Reader:
    """One store, kept open on one event loop, for the tests' polls (every 50 ms: a
    connection per poll cost the machine more CPU than the fleet under test)."""

    def __init__(self, url: str) -> None:
        self._loop = asyncio.Runner()
        self._store = self._loop.run(toren.connect(url))

    def close(self) -> None:
        self._loop.run(self._store.close())
        self._loop.close()

    def finished(self, ids: list[str]) -> int:
        """How many of ``ids`` completed, in one query."""
        found = self._loop.run(self._store.list_runs(status="completed", limit=RUNS + 1))
        return len({r.id for r in found}.intersection(ids))

    def held_by(self, ids: list[str], pid: int) -> list[str]:
        """The runs of ``ids`` whose lease the worker process ``pid`` holds (its worker
        id is ``host-PID-random``), in one query."""
        found = self._loop.run(self._store.list_runs(status="running", limit=RUNS + 1))
        wanted = set(ids)
        return [r.id for r in found if r.id in wanted and f"-{pid}-" in (r.lease_owner or "")]


def test_a_key_never_runs_more_than_its_limit_while_workers_die(db_url: str) -> None:
    """PostgreSQL with three worker processes, SQLite with one (killed and restarted)."""
    pg = db_url
    fleet = 3 if db_url.startswith("postgres") else 1
    desk = Desk()
    reader = Reader(pg)
    server = serve(desk)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    rng = random.Random(os.urandom(8))
    try:
        ids = asyncio.run(_start(pg, base))
        workers = [_worker(pg, base) for _ in range(fleet)]
        kills = 0
        deadline = time.monotonic() + 300
        try:
            while (done := reader.finished(ids)) < RUNS:
                assert time.monotonic() < deadline, f"only {done} of {RUNS} runs completed"
                # Kill a random worker after a random number of served calls.
                target = sum(desk.finished.values()) + rng.randint(5, 25)
                while sum(desk.finished.values()) < target and time.monotonic() < deadline:
                    if reader.finished(ids) == RUNS:
                        break
                    time.sleep(0.05)
                if kills < 8 and reader.finished(ids) < RUNS:
                    victim = rng.randrange(fleet)
                    _end(workers[victim], signal.SIGKILL)
                    kills += 1
                    workers[victim] = _worker(pg, base)
        finally:
            for w in workers:
                if w.poll() is None:
                    _end(w, signal.SIGTERM)
    finally:
        reader.close()
        server.shutdown()
        server.server_close()
    assert kills >= 3
    assert max(desk.peak.values()) <= LIMIT, desk.peak
    assert max(desk.peak.values()) == LIMIT  # the limit was reached, not just respected
    assert set(desk.finished) == set(ids)  # every run's call was served to the end


async def _tool_records(url: str, ids: list[str]) -> dict[str, int]:
    store = await toren.connect(url)
    try:
        return {
            i: sum(e.type == "ToolCallRecorded" for e in await store.load_events(i)) for i in ids
        }
    finally:
        await store.close()


async def _recoveries(url: str, ids: list[str]) -> dict[str, int]:
    store = await toren.connect(url)
    try:
        return {i: (await store.get_run(i)).lease_recoveries for i in ids}  # type: ignore[union-attr]
    finally:
        await store.close()


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (by SIGSTOP), by its state in /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _until(done: Any, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_worker_frozen_past_its_lease_gives_its_slots_back(pg_only_url: str) -> None:
    """A worker SIGSTOPped while its runs hold their keys' slots: once its leases run out,
    the other workers take those runs (and the slots) over; when it is SIGCONTed it finds
    its leases gone and writes nothing. No key ever runs more than its limit, every run
    completes, and each run's tool step is recorded exactly once."""
    pg = pg_only_url
    desk = Desk()
    reader = Reader(pg)
    server = serve(desk)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        ids = asyncio.run(_start(pg, base))
        workers = [_worker(pg, base) for _ in range(3)]
        victim = workers[0]
        try:
            _until(lambda: sum(desk.finished.values()) >= 20, "the first 20 runs")
            held: list[str] = []

            def holding() -> bool:
                held[:] = reader.held_by(ids, victim.pid)
                return bool(held)

            _until(holding, "the victim to hold a run")
            victim.send_signal(signal.SIGSTOP)
            # Read once it is stopped: every tool it began, it began before this.
            _until(lambda: _stopped(victim.pid), "the victim to stop")
            frozen_at = time.time()
            try:
                # What it held at the moment it froze (a run it was releasing may finish).
                held = reader.held_by(ids, victim.pid)
                assert held, "the worker released every run as it froze: nothing to take over"
                _until(
                    lambda: reader.finished(held) == len(held),
                    "the frozen worker's runs to be taken over and finish",
                )
            finally:
                thawed_at = time.monotonic()
                victim.send_signal(signal.SIGCONT)
            _until(lambda: reader.finished(ids) == RUNS, "every run", 300)
        finally:
            for w in workers:
                if w.poll() is None:
                    _end(w, signal.SIGTERM)
    finally:
        reader.close()
        server.shutdown()
        server.server_close()

    # A tool function the frozen worker was running when it froze runs on after the thaw
    # and makes its call, its result then refused by the fence: the documented window of
    # a pause (docs/storage.md, "The remaining window"; docs/flow-control.md). Those calls
    # (the thawed worker's, for runs it had held, of tools begun before the freeze) are
    # over the key's limit for their moment, at most one per run it held; every other
    # call keeps to the limit, a tool the thawed worker began afterwards included.
    def in_the_window(call: tuple[str, str, int, float, float, float]) -> bool:
        _, run, pid, began, _, tool_began = call
        return pid == victim.pid and began >= thawed_at and tool_began < frozen_at and run in held

    window = [c for c in desk.calls if in_the_window(c)]
    assert len(window) <= len(held) and len({c[1] for c in window}) == len(window), window
    peaks = desk.peaks(leaving_out=in_the_window)
    assert max(peaks.values()) <= LIMIT, (peaks, window)
    assert set(desk.finished) == set(ids)
    recovered = asyncio.run(_recoveries(pg, held))
    assert all(n >= 1 for n in recovered.values()), recovered  # taken over, not waited out
    records = asyncio.run(_tool_records(pg, ids))
    assert set(records.values()) == {1}, {i: n for i, n in records.items() if n != 1}
