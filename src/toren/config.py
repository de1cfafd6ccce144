"""Runtime settings: one typed record, every key documented and defaulted.

Nothing here reads the environment at import time. ``Settings.from_env()`` reads it when a
program (the CLI, a worker) asks, so two runtimes with different settings can live in one
process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from toren.durations import parse_duration
from toren.errors import InvalidInput


@dataclass(frozen=True)
class LeaseSettings:
    ttl: float = 30.0  # seconds a claim stays valid without a heartbeat
    heartbeat: float = 5.0  # seconds between lease renewals (and cancel checks)
    # Before a live step starts, a lease with this many seconds or fewer left (on the
    # worker's own clock) is renewed first, fenced by its epoch; None: a third of the TTL,
    # at most ttl - 2 * heartbeat. See docs/storage.md, "Stalled workers".
    margin: float | None = None

    @property
    def fence_margin(self) -> float:
        if self.margin is not None:
            return self.margin
        return max(0.0, min(self.ttl / 3, self.ttl - 2 * self.heartbeat))


@dataclass(frozen=True)
class RetentionSettings:
    """Pruning finished runs from a worker (off by default: nothing is ever deleted unless
    asked). See docs/storage.md#retention."""

    finished_after: float | None = None  # seconds after finishing that a run is pruned
    batch: int = 100  # runs deleted per transaction
    interval: float = 60.0  # seconds between batches while nothing is left to prune
    pause: float = 1.0  # seconds between batches while catching up
    # Seconds between sweeps of shared message bodies no remaining run references (a
    # sweep reads the whole log; it runs after a prune round, at most this often).
    sweep_interval: float = 3600.0


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
class RateLimit:
    """A provider model's rate limit, shared by every worker through the database
    (docs/flow-control.md#provider-rate-limits): at most ``rpm`` model calls and ``tpm``
    tokens (estimated before the call, corrected after) in any window of ``period``
    seconds. Either may be None (not limited); with both None the entry only shares the
    provider's 429s across the fleet."""

    rpm: int | None = None
    tpm: int | None = None
    period: float = 60.0  # the window; 60 s for the per-minute limits providers publish

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not 1 <= value <= 10**12):
                raise InvalidInput(f"rate limit {name} must be a whole number >= 1; got {value!r}")
        if not (isinstance(self.period, int | float) and 0.001 <= self.period <= 86_400):
            raise InvalidInput(
                f"rate limit period must be between 0.001 and 86400 seconds; got {self.period!r}"
            )


RATE_KEY = "a provider and model such as 'openai:gpt-4o-mini'"


def rate_limits(raw: object, where: str) -> dict[str, RateLimit]:
    """Limits from their plain form: ``{"openai:gpt-4o-mini": {"rpm": 500, "tpm": 30000,
    "period": "60s"}}`` (JSON, agent.yaml). ``InvalidInput`` naming ``where`` and the key."""
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"{where}: a mapping of {RATE_KEY} to {{rpm, tpm, period}}")
    found: dict[str, RateLimit] = {}
    for key, spec in raw.items():
        provider, _, model = str(key).partition(":")
        if not isinstance(key, str) or not provider or not model or len(key) > 255:
            raise InvalidInput(f"{where}: key {key!r} is not {RATE_KEY}")
        spec = {} if spec is None else spec
        if not isinstance(spec, Mapping) or set(spec) - {"rpm", "tpm", "period"}:
            raise InvalidInput(
                f"{where}: {key!r} takes rpm, tpm and period (seconds or a duration "
                f"such as '60s'); found {spec!r}"
            )
        period = spec.get("period", 60.0)
        try:
            if isinstance(period, str):
                period = parse_duration(period)
            found[key] = RateLimit(rpm=spec.get("rpm"), tpm=spec.get("tpm"), period=period)
        except InvalidInput as exc:
            raise InvalidInput(f"{where}: {key!r}: {exc}") from None
    return found


@dataclass(frozen=True)
class Settings:
    database_url: str = "sqlite:///.toren/toren.db"
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    concurrency: int = 100  # runs one worker executes at once
    drain_window: float = 30.0  # seconds a stopping worker lets running steps finish
    poll_interval: float = 0.25  # idle claim polling (SQLite; Postgres also LISTENs)
    schedules: bool = True  # workers fire due schedules (toren.core.drivers.scheduler)
    worker_ttl: float = 30.0  # a worker silent this long is not live (storm guard)
    inline_wait: float = 2.0  # sleeps/timeouts this short wait in-process, not parked
    # A run whose other branches all wait durably parks only once a branch busy with work
    # the log does not cover (an await outside ctx) finishes, or after this many seconds.
    park_grace: float = 10.0
    code_version: str | None = None  # overrides the agent directory hash
    # During rolling deploys, never invalidate a suffix written by a newer live code
    # version (back off instead). Off only to demonstrate the storm it prevents.
    storm_guard: bool = True
    # Pause Python's cycle collector (process-wide) while a tick replays: a third of a long
    # replay's time (see toren.core.drivers.tickstate.ReplayGcPause). A host embedding a worker
    # that must not have gc.disable() called under it turns this off.
    pause_gc_on_replay: bool = True
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    blocked_retry: BlockedRetry = field(default_factory=BlockedRetry)
    # Provider rate limits by "provider:model" (TOREN_RATE_LIMITS, JSON); an agent's own
    # agent.yaml ``rate_limits:`` entry for the same key wins. docs/flow-control.md.
    rate_limits: Mapping[str, RateLimit] = field(default_factory=dict)

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
            if raw is None or f.name in (
                "lease",
                "storm_guard",
                "retention",
                "blocked_retry",
                "rate_limits",
            ):
                continue
            try:
                if f.name == "pause_gc_on_replay":
                    changes[f.name] = raw.strip().lower() not in ("0", "false", "no", "off")
                elif f.name == "concurrency":
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
        for key in ("ttl", "heartbeat", "margin"):
            raw = env.get(f"TOREN_LEASE_{key.upper()}")
            if raw is not None:
                try:
                    lease = replace(lease, **{key: float(raw)})
                except ValueError:
                    raise InvalidInput(
                        f"environment variable TOREN_LEASE_{key.upper()}={raw!r} is not a number"
                    ) from None
        changes["retention"] = _retention_from_env(env, base.retention)
        raw_limits = env.get("TOREN_RATE_LIMITS")
        if raw_limits is not None and raw_limits.strip():
            try:
                parsed = json.loads(raw_limits)
            except ValueError as exc:
                raise InvalidInput(
                    f"environment variable TOREN_RATE_LIMITS is not JSON ({exc})"
                ) from None
            changes["rate_limits"] = rate_limits(parsed, "TOREN_RATE_LIMITS")
        return replace(base, lease=lease, **changes)  # type: ignore[arg-type]


def _retention_from_env(env: Mapping[str, str], base: RetentionSettings) -> RetentionSettings:
    """``TOREN_RETENTION`` (a duration: ``30d``; ``off`` or empty: keep everything),
    ``TOREN_RETENTION_BATCH``, ``TOREN_RETENTION_INTERVAL``."""
    changes: dict[str, object] = {}
    raw = env.get("TOREN_RETENTION")
    if raw is not None and raw.strip().lower() not in ("", "off", "none"):
        try:
            changes["finished_after"] = parse_duration(raw)
        except InvalidInput as exc:
            raise InvalidInput(f"environment variable TOREN_RETENTION: {exc}") from None
    for key, kind in (("batch", int), ("interval", float)):
        value = env.get(f"TOREN_RETENTION_{key.upper()}")
        if value is None:
            continue
        try:
            number = kind(value)
        except ValueError:
            raise InvalidInput(
                f"environment variable TOREN_RETENTION_{key.upper()}={value!r} is not a number"
            ) from None
        if number <= 0:
            raise InvalidInput(
                f"environment variable TOREN_RETENTION_{key.upper()}={value!r} must be positive"
            )
        changes[key] = number
    return replace(base, **changes)  # type: ignore[arg-type]
