"""Shared pieces of the benchmark: the fake model, the backends, the model HTTP client,
step clocks and the crash counter. Every system (DBOS, LangGraph, Toren) uses these same
helpers so the scenarios are identical.

Durability, identical for every system:
  * SQLite: journal_mode=WAL, synchronous=FULL (every commit fsyncs the WAL).
  * PostgreSQL 15 on 127.0.0.1: fsync=on, synchronous_commit=on (server defaults).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import shutil
import sqlite3
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_USER = "postgres"
PG_MAIN_DB = "toren_bench"
SQLITE_SYNCHRONOUS = "FULL"
RESPONSE_BYTES = 2048

# --------------------------------------------------------------------------- fake model

_rng = random.Random(20240901)
_WORDS = [
    "".join(_rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_rng.randint(2, 9)))
    for _ in range(4000)
]


def _make_text(seed: int, size: int) -> str:
    r = random.Random(seed)
    out: list[str] = []
    n = 0
    while n < size:
        w = r.choice(_WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:size]


_POOL = [_make_text(s, RESPONSE_BYTES) for s in range(64)]


def fake_model(step: int, prompt: Any = None) -> str:
    """The zero-latency model: a deterministic in-process function returning a 2 KB string
    (word-like text, about as compressible as prose). ``prompt`` (e.g. the whole history)
    is touched, as a real client would serialise it, but does not change the answer."""
    if isinstance(prompt, list):
        _ = sum(len(m) for m in prompt)
    head = f"step {step:06d}: "
    return head + _POOL[step % 64][len(head) :]


# --------------------------------------------------------------------------- backends


def pg_dsn(db: str) -> str:
    return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{db}"


def pg_admin_exec(sql: str) -> None:
    import psycopg

    with psycopg.connect(pg_dsn("postgres"), autocommit=True) as c:
        c.execute(sql)


def ensure_main_pg_db() -> None:
    import psycopg

    with psycopg.connect(pg_dsn("postgres"), autocommit=True) as c:
        row = c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_MAIN_DB,)).fetchone()
        if row is None:
            c.execute(f'CREATE DATABASE "{PG_MAIN_DB}"')


def pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(pg_dsn("postgres"), connect_timeout=3):
            return True
    except Exception:
        return False


@dataclass
class Backend:
    """Where a system keeps its state for one scenario: a fresh SQLite file in a fresh
    directory, or a fresh PostgreSQL database ``toren_bench_<tag>``."""

    kind: str  # "sqlite" | "postgres"
    tag: str
    sqlite_path: str = ""  # sqlite: the database file (may not exist yet)
    pg_db: str = ""  # postgres: the database name

    @property
    def pg_dsn(self) -> str:
        return pg_dsn(self.pg_db)

    @property
    def sqlalchemy_url(self) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{self.sqlite_path}"
        return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.pg_db}"

    @property
    def workdir(self) -> str:
        """A scratch directory for this scenario (counter files etc.)."""
        if self.kind == "sqlite":
            return os.path.dirname(self.sqlite_path)
        d = os.path.join(tempfile.gettempdir(), f"toren_bench_{self.tag}")
        os.makedirs(d, exist_ok=True)
        return d

    # -- lifecycle
    @classmethod
    def fresh(cls, kind: str, tag: str) -> Backend:
        """A new, empty database, on a quiet disk: what earlier scenarios wrote (GBs, for
        LangGraph's conversation) is flushed first, and PostgreSQL checkpointed, so no
        system's commits wait behind another's background writes."""
        tag = tag.replace("-", "_").lower()
        os.sync()
        if kind == "postgres":
            pg_admin_exec("CHECKPOINT")
        if kind == "sqlite":
            d = tempfile.mkdtemp(prefix=f"toren_bench_{tag}_")
            return cls(kind, tag, sqlite_path=os.path.join(d, "bench.sqlite"))
        if kind == "postgres":
            db = f"toren_bench_{tag}"
            pg_admin_exec(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            pg_admin_exec(f'CREATE DATABASE "{db}"')
            return cls(kind, tag, pg_db=db)
        raise ValueError(kind)

    def drop(self) -> None:
        if self.kind == "sqlite":
            shutil.rmtree(os.path.dirname(self.sqlite_path), ignore_errors=True)
        else:
            try:
                pg_admin_exec(f'DROP DATABASE IF EXISTS "{self.pg_db}" WITH (FORCE)')
            except Exception:
                pass
            shutil.rmtree(self.workdir, ignore_errors=True)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, s: str) -> Backend:
        return cls(**json.loads(s))

    # -- measurement
    def size_bytes(self) -> int:
        """Bytes the database holds now. SQLite: live pages (page_count - freelist) x
        page_size as seen by a fresh reader, so WAL frames not yet checkpointed count and
        the WAL file's preallocation does not. PostgreSQL: pg_database_size."""
        if self.kind == "sqlite":
            if not os.path.exists(self.sqlite_path):
                return 0
            c = sqlite3.connect(self.sqlite_path)
            try:
                pc = c.execute("PRAGMA page_count").fetchone()[0]
                fl = c.execute("PRAGMA freelist_count").fetchone()[0]
                ps = c.execute("PRAGMA page_size").fetchone()[0]
                return int((pc - fl) * ps)
            finally:
                c.close()
        import psycopg

        with psycopg.connect(pg_dsn("postgres"), autocommit=True) as c:
            return int(c.execute("SELECT pg_database_size(%s)", (self.pg_db,)).fetchone()[0])


def apply_sqlite_durability(conn: Any) -> None:
    """Set WAL + synchronous=FULL on a DB-API sqlite connection (sqlite3 or an adapter)."""
    cur = conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA synchronous={SQLITE_SYNCHRONOUS}")
    cur.close()


# --------------------------------------------------------------------------- timing


class StepClock:
    """Record the start time of every step execution (inside the step/node function)."""

    def __init__(self) -> None:
        self.t: list[float] = []

    def tick(self) -> None:
        self.t.append(time.perf_counter())

    def rates(self, window: int = 10) -> dict[str, float]:
        """Steps/s over the first and last ``window`` steps: from the start of step 1 to
        the start of step window+1, and from the start of step n-window-1 to step n."""
        t = self.t
        if len(t) < 2 * window + 2:
            return {}
        first = window / (t[window] - t[0])
        last = window / (t[-1] - t[-1 - window])
        return {
            "first10_steps_per_s": round(first, 1),
            "last10_steps_per_s": round(last, 1),
            "first_over_last": round(first / last, 2),
        }


def peak_rss_mb() -> float:
    """Peak RSS of this process in MB: VmHWM from /proc/self/status (reset at exec).
    ``getrusage(RUSAGE_SELF).ru_maxrss`` is not used as the figure because Linux carries
    it across fork+exec, so a worker spawned by a 100 MB harness would report >= 100 MB;
    :func:`ru_maxrss_mb` gives it anyway for reference."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        pass
    return ru_maxrss_mb()


def ru_maxrss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


# --------------------------------------------------------------------------- crash counter


class CrashCounter:
    """Step functions call ``hit()`` once per execution: it appends a line to
    ``path`` (O_APPEND, survives SIGKILL). If ``hang_at`` > 0 and this is execution number
    ``hang_at`` of this process, it then blocks so the parent's SIGKILL lands while that
    step is in flight (steps 1..hang_at-1 are complete, step hang_at is not)."""

    def __init__(self, path: str, hang_at: int = 0) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.hang_at = hang_at
        self.n = 0

    def hit(self, step: int) -> None:
        self.n += 1
        os.write(self.fd, f"{step}\n".encode())
        if self.hang_at and self.n == self.hang_at:
            time.sleep(120)  # the parent SIGKILLs us here

    async def ahit(self, step: int) -> None:
        self.n += 1
        os.write(self.fd, f"{step}\n".encode())
        if self.hang_at and self.n == self.hang_at:
            await asyncio.sleep(120)


# --------------------------------------------------------------------------- model client


class ModelClient:
    """A minimal HTTP/1.1 keep-alive client for bench/model_server.py (loopback only).
    Deliberately tiny so the client's own overhead does not dominate the comparison; every
    system's step calls ``await client.complete(...)``."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        if u.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("benchmarks only talk to loopback")
        self.host = u.hostname
        self.port = u.port or 80
        self.path = u.path or "/v1/complete"
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def complete(self, prompt: str) -> str:
        body = json.dumps({"prompt": prompt[-512:]}).encode()
        req = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        for attempt in range(3):
            if self._idle:
                reader, writer = self._idle.pop()
            else:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            try:
                writer.write(req)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                data = await reader.readexactly(length)
            except (ConnectionError, asyncio.IncompleteReadError):
                writer.close()
                if attempt == 2:
                    raise
                continue
            self._idle.append((reader, writer))
            return str(json.loads(data)["content"])
        raise RuntimeError("unreachable")

    async def aclose(self) -> None:
        for _, w in self._idle:
            w.close()
        self._idle.clear()
