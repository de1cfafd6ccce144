"""Runtime settings: one typed record, every key documented and defaulted.

Nothing here reads the environment at import time. ``Settings.from_env()`` reads it when a
program (the CLI, a worker) asks, so two runtimes with different settings can live in one
process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from toren.errors import InvalidInput


@dataclass(frozen=True)
class LeaseSettings:
    ttl: float = 30.0  # seconds a claim stays valid without a heartbeat
    heartbeat: float = 5.0  # seconds between lease renewals (and cancel checks)


@dataclass(frozen=True)
class BlockedRetry:
    """How a blocked run is retried: a tick that failed on an infrastructure error (no
    API key, provider SDK missing, the database, an agent this worker cannot load) gives
    the run back with ``not_before`` = now + ``first`` * 2 ** (attempt - 1), at most
    ``maximum`` seconds: a backoff, never a hot loop. Sending a message or cancelling
    wakes the run at once."""

    first: float = 1.0  # seconds before the first retry
    maximum: float = 300.0  # the cap

    def delay(self, attempt: int) -> float:
        """Seconds to wait after the ``attempt``-th failed tick in a row (from 1)."""
        return min(self.maximum, self.first * 2.0 ** max(0, min(attempt - 1, 60)))


@dataclass(frozen=True)
class Settings:
    database_url: str = "sqlite:///.toren/toren.db"
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    concurrency: int = 100  # runs one worker executes at once
    drain_window: float = 30.0  # seconds a stopping worker lets running steps finish
    poll_interval: float = 0.25  # idle claim polling (SQLite; Postgres also LISTENs)
    worker_ttl: float = 30.0  # a worker silent this long is not live (storm guard)
    inline_wait: float = 2.0  # sleeps/timeouts this short wait in-process, not parked
    # A run whose other branches all wait durably parks only once a branch busy with work
    # the log does not cover (an await outside ctx) finishes, or after this many seconds.
    park_grace: float = 10.0
    code_version: str | None = None  # overrides the agent directory hash
    # During rolling deploys, never invalidate a suffix written by a newer live code
    # version (back off instead). Off only to demonstrate the storm it prevents.
    storm_guard: bool = True
    blocked_retry: BlockedRetry = field(default_factory=BlockedRetry)

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``TOREN_*`` variables (each mirrored by a CLI flag)."""
        env = os.environ if env is None else env
        base = cls()
        changes: dict[str, object] = {}
        floats = {f.name for f in fields(cls) if f.type in ("float", float)}
        for f in fields(cls):
            raw = env.get(f"TOREN_{f.name.upper()}")
            if raw is None or f.name in ("lease", "storm_guard", "blocked_retry"):
                continue
            try:
                if f.name == "concurrency":
                    changes[f.name] = int(raw)
                elif f.name in floats:
                    changes[f.name] = float(raw)
                else:
                    changes[f.name] = raw
            except ValueError:
                raise InvalidInput(
                    f"environment variable TOREN_{f.name.upper()}={raw!r} is not a number"
                ) from None
        lease = base.lease
        for key in ("ttl", "heartbeat"):
            raw = env.get(f"TOREN_LEASE_{key.upper()}")
            if raw is not None:
                try:
                    lease = replace(lease, **{key: float(raw)})
                except ValueError:
                    raise InvalidInput(
                        f"environment variable TOREN_LEASE_{key.upper()}={raw!r} is not a number"
                    ) from None
        return replace(base, lease=lease, **changes)  # type: ignore[arg-type]
