"""``GET /metrics``: Prometheus text exposition format (version 0.0.4), written by hand
from ``Store.stats()`` so the API needs no metrics library. The totals are over the whole
database (every worker's runs), not this process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toren.api.state import InProcessWorker
from toren.core.contract.schedule import ScheduleState
from toren.store.base import STATUSES, from_nano

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render(stats: Mapping[str, Any], runtime: InProcessWorker | None = None) -> str:
    lines: list[str] = []

    def metric(name: str, kind: str, help: str, samples: list[tuple[str, object]]) -> None:
        lines.append(f"# HELP {name} {help}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {value}")

    by_status = stats.get("runs_by_status", {})
    statuses = list(STATUSES) + sorted(set(by_status) - set(STATUSES))
    metric(
        "toren_runs",
        "gauge",
        "Runs by status.",
        [(f'{{status="{s}"}}', int(by_status.get(s, 0))) for s in statuses],
    )
    metric("toren_steps_total", "counter", "Steps executed live.", [("", stats["steps"])])
    metric(
        "toren_tokens_total",
        "counter",
        "Model tokens paid for, by direction.",
        [('{kind="input"}', stats["input_tokens"]), ('{kind="output"}', stats["output_tokens"])],
    )
    metric(
        "toren_cost_usd_total",
        "counter",
        "Model cost paid, in US dollars.",
        [("", float(from_nano(int(stats["cost_nanousd"]))))],
    )
    metric(
        "toren_saved_by_replay_usd_total",
        "counter",
        "Model cost not paid again thanks to replay, in US dollars.",
        [("", float(from_nano(int(stats["saved_nanousd"]))))],
    )
    metric(
        "toren_lease_recoveries_total",
        "counter",
        "Runs recovered from an expired lease (a worker died or stalled).",
        [("", stats["lease_recoveries"])],
    )
    metric(
        "toren_invalidations_total",
        "counter",
        "Stream invalidations (new code disagreed with the recorded steps).",
        [("", stats["invalidations"])],
    )
    if "queue_depth" in stats:
        metric(
            "toren_queue_depth",
            "gauge",
            "Runs runnable now that no worker holds (what worker autoscaling follows).",
            [("", stats["queue_depth"])],
        )
    limits: list[tuple[str, int, int, float, int, int]] = list(stats.get("rate_limits", ()))
    if limits:
        # docs/flow-control.md#provider-rate-limits: one series per "provider:model".
        label = [f'{{model="{key}"}}' for key, *_ in limits]
        for name, kind, help, at in (
            ("toren_rate_limit_calls_total", "counter", "Model calls that took a slot.", 1),
            (
                "toren_rate_limit_paced_total",
                "counter",
                "Times a model call was held back for its slot (a run parked or waited).",
                2,
            ),
            (
                "toren_rate_limit_wait_seconds_total",
                "counter",
                "Seconds model calls were held back for their slots, summed.",
                3,
            ),
            (
                "toren_rate_limit_429s_total",
                "counter",
                "429 answers of the provider to limited calls (each blocks the key fleet-wide).",
                4,
            ),
            (
                "toren_rate_limit_parked_runs",
                "gauge",
                "Runs parked now waiting for their next slot.",
                5,
            ),
        ):
            samples: list[tuple[str, object]] = [
                (lb, round(float(row[at]), 6)) for lb, row in zip(label, limits, strict=True)
            ]
            metric(name, kind, help, samples)
    if runtime is not None:
        m = runtime.metrics
        metric(
            "toren_worker_active_runs",
            "gauge",
            "Runs this process's worker is executing now.",
            [("", len(runtime.active_runs))],
        )
        metric(
            "toren_worker_backoffs_total",
            "counter",
            "Ticks this worker gave up because a newer live code version owns the stream "
            "(the invalidation-storm guard).",
            [("", m.backoffs)],
        )
        metric(
            "toren_worker_ticks_total",
            "counter",
            "Ticks this worker ran, by how they ended.",
            [(f'{{result="{k}"}}', v) for k, v in sorted(m.ticks.items())],
        )
        metric(
            "toren_worker_schedule_lost_races_total",
            "counter",
            "Due schedule times this worker looked at that another worker decided first.",
            [("", runtime.scheduler.metrics.lost_races)],
        )
        metric(
            "toren_worker_steps_total",
            "counter",
            "Steps this worker's ticks executed live or replayed from the log.",
            [('{how="executed"}', m.steps_executed), ('{how="replayed"}', m.steps_replayed)],
        )
        sticky = runtime.deps.sticky
        if sticky is not None:  # docs/cli.md, TOREN_STICKY_CACHE_MB
            metric(
                "toren_worker_sticky_runs",
                "gauge",
                "Parked runs this worker keeps in memory to continue in place.",
                [("", len(sticky))],
            )
            metric(
                "toren_worker_sticky_bytes",
                "gauge",
                "The estimated size of the runs kept (bounded by TOREN_STICKY_CACHE_MB).",
                [("", sticky.bytes)],
            )
            metric(
                "toren_worker_sticky_claims_total",
                "counter",
                "Claims of this worker by what the cache had for the run: continued in "
                "place, kept but stale (replayed), or nothing (a first claim, or a run "
                "evicted or parked elsewhere: replayed or started).",
                [
                    ('{result="continued"}', sticky.continued),
                    ('{result="stale"}', sticky.stale),
                    ('{result="miss"}', sticky.misses),
                ],
            )
            metric(
                "toren_worker_sticky_evictions_total",
                "counter",
                "Kept runs dropped to stay within the cache's size (they replay when claimed).",
                [("", sticky.evictions)],
            )
    schedules: list[ScheduleState] = list(stats.get("schedules", ()))
    if schedules:
        label = [f'{{schedule="{s.id}"}}' for s in schedules]
        metric(
            "toren_schedule_fires_total",
            "counter",
            "Runs started by each schedule on its timeline (all workers).",
            [(lb, s.fires) for lb, s in zip(label, schedules, strict=True)],
        )
        metric(
            "toren_schedule_skips_total",
            "counter",
            "Nominal times each schedule skipped (overlap, catch-up; the reason is in its row).",
            [(lb, s.skips) for lb, s in zip(label, schedules, strict=True)],
        )
        metric(
            "toren_schedule_lateness_seconds_total",
            "counter",
            "Seconds between each firing's nominal time and the start of its run, summed "
            "(divide by fires for the mean lateness).",
            [(lb, round(s.lateness_total, 6)) for lb, s in zip(label, schedules, strict=True)],
        )
        metric(
            "toren_schedule_paused",
            "gauge",
            "1 for a paused schedule.",
            [(lb, int(s.paused)) for lb, s in zip(label, schedules, strict=True)],
        )
    return "\n".join(lines) + "\n"
