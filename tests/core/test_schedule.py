"""The pure schedule rules (toren.core.contract.schedule): when a spec fires, DST in a named zone,
and what a due schedule does under each overlap and catch-up policy."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from toren.core.contract.schedule import (
    ScheduleError,
    ScheduleSpec,
    Skip,
    backfill_times,
    decide,
    firing_key,
    jitter_of,
    next_after,
    nominal_text,
    times,
)

PARIS = ZoneInfo("Europe/Paris")


def ts(text: str, zone: ZoneInfo = UTC) -> float:  # type: ignore[assignment]
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


def local(t: float) -> str:
    return datetime.fromtimestamp(t, PARIS).strftime("%Y-%m-%d %H:%M %Z")


HOURLY = ScheduleSpec(cron="0 * * * *")


def test_cron_and_interval_times() -> None:
    start = ts("2026-03-01T10:20:00")
    assert nominal_text(next_after(HOURLY, start)) == "2026-03-01T11:00:00Z"
    # Strictly after: a nominal time is not its own next.
    assert next_after(HOURLY, ts("2026-03-01T11:00:00")) == ts("2026-03-01T12:00:00")
    every = ScheduleSpec(every=600)
    assert next_after(every, ts("2026-03-01T10:20:00")) == ts("2026-03-01T10:30:00")
    assert times(every, ts("2026-03-01T10:00:00"), ts("2026-03-01T10:30:00")) == [
        ts("2026-03-01T10:00:00"),
        ts("2026-03-01T10:10:00"),
        ts("2026-03-01T10:20:00"),
        ts("2026-03-01T10:30:00"),
    ]
    assert firing_key("a/b", ts("2026-03-01T10:00:00")) == "schedule:a/b:2026-03-01T10:00:00Z"


def test_spring_forward_fires_at_the_first_minute_that_exists() -> None:
    """Europe/Paris, 2026-03-29: 02:00 CET jumps to 03:00 CEST. A daily 02:30 fires at
    03:00 CEST that day, once, and at 02:30 again the next day."""
    spec = ScheduleSpec(cron="30 2 * * *", zone="Europe/Paris")
    fired = times(spec, ts("2026-03-27T12:00:00"), ts("2026-03-31T12:00:00"))
    assert [local(t) for t in fired] == [
        "2026-03-28 02:30 CET",
        "2026-03-29 03:00 CEST",
        "2026-03-30 02:30 CEST",
        "2026-03-31 02:30 CEST",
    ]


def test_fall_back_fires_once_at_the_first_occurrence() -> None:
    """Europe/Paris, 2026-10-25: 03:00 CEST goes back to 02:00 CET, so 02:30 happens
    twice. A daily 02:30 fires once, at the first (CEST) 02:30."""
    spec = ScheduleSpec(cron="30 2 * * *", zone="Europe/Paris")
    fired = times(spec, ts("2026-10-23T12:00:00"), ts("2026-10-27T12:00:00"))
    assert [local(t) for t in fired] == [
        "2026-10-24 02:30 CEST",
        "2026-10-25 02:30 CEST",
        "2026-10-26 02:30 CET",
        "2026-10-27 02:30 CET",
    ]
    # The real interval between the fall-back day's fire and the next day's is 25 h.
    assert fired[2] - fired[1] == 25 * 3600


def test_an_hourly_cron_across_both_transitions() -> None:
    """A wildcard hour fires at each real occurrence of a matching wall-clock time: 23
    fires on the spring-forward day, 25 on the fall-back day (02:00 CEST and 02:00 CET):
    an hourly schedule keeps firing every hour."""
    spec = ScheduleSpec(cron="0 * * * *", zone="Europe/Paris")
    spring = times(spec, ts("2026-03-29T00:00:00", PARIS), ts("2026-03-29T23:59:00", PARIS))
    assert len(spring) == 23 and "2026-03-29 02:00" not in {local(t)[:16] for t in spring}
    fall = times(spec, ts("2026-10-25T00:00:00", PARIS), ts("2026-10-25T23:59:00", PARIS))
    assert len(set(fall)) == len(fall) == 25
    assert {t2 - t1 for t1, t2 in zip(fall, fall[1:], strict=False)} == {3600.0}


@pytest.mark.parametrize(
    ("fields", "field", "expected"),
    [
        ({"cron": "0 25 * * *"}, "cron", "not a valid cron expression"),
        ({"cron": "every day"}, "cron", "five fields"),
        ({"cron": "0 * * * *", "every": 60}, "cron/every", "exactly one"),
        ({}, "cron/every", "exactly one"),
        ({"every": 0.5}, "every", "whole seconds"),
        ({"every": 90.5}, "every", "whole seconds"),
        ({"every": float("inf")}, "every", "whole seconds"),
        ({"cron": "0 * * * *", "zone": "Mars/Olympus"}, "zone", "IANA time zone"),
        ({"cron": "0 * * * *", "overlap": "sometimes"}, "overlap", "skip, buffer_one"),
        ({"cron": "0 * * * *", "catch_up": "most"}, "catch_up", "latest, all"),
        ({"cron": "0 * * * *", "jitter": -1}, "jitter", ">= 0"),
        ({"every": 60, "jitter": 60}, "jitter", "less than the interval"),
        ({"every": 60, "jitter": 90, "catch_up": "all"}, "jitter", "less than the interval"),
    ],
)
def test_nonsense_is_refused_with_the_field(fields: dict, field: str, expected: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ScheduleError, match=expected) as raised:
        ScheduleSpec(**fields)
    assert raised.value.field == field


def test_jitter_is_the_same_everywhere_and_within_bounds() -> None:
    offsets = [jitter_of("a/b", float(t), 30.0) for t in range(0, 60_000, 60)]
    assert all(0 <= o < 30 for o in offsets)
    assert offsets == [jitter_of("a/b", float(t), 30.0) for t in range(0, 60_000, 60)]
    assert len({round(o, 3) for o in offsets}) > 900  # spread, not one offset
    assert jitter_of("a/b", 60.0, 0) == 0


def _decide(spec: ScheduleSpec, nxt: float, now: float, **kw: object):  # type: ignore[no-untyped-def]
    args = {"last_run": "run_prev", "last_running": False, "buffered": None, **kw}
    return decide(spec, "a/s", next_fire_at=nxt, now=now, **args)  # type: ignore[arg-type]


H = 3600.0
T0 = ts("2026-06-01T10:00:00")


def test_nothing_due_decides_nothing() -> None:
    assert _decide(HOURLY, T0, T0 - 1) is None


def test_a_due_time_fires_and_moves_on() -> None:
    d = _decide(HOURLY, T0, T0 + 0.2)
    assert d is not None and d.fire == [T0] and d.skips == [] and d.next_fire_at == T0 + H


def test_a_two_hour_outage_fires_the_latest_missed_time_once() -> None:
    """Hourly; no worker ran from 10:00 to 12:30: 10:00, 11:00 and 12:00 are due. The
    default catch-up fires 12:00 once; the two others are skipped, with the reason."""
    d = _decide(HOURLY, T0, T0 + 2.5 * H)
    assert d is not None
    assert d.fire == [T0 + 2 * H]
    assert d.skips == [
        Skip(T0, "missed; catch-up fires only the latest"),
        Skip(T0 + H, "missed; catch-up fires only the latest"),
    ]
    assert d.next_fire_at == T0 + 3 * H
    spec = ScheduleSpec(cron="0 * * * *", catch_up="all", overlap="allow_all")
    every = _decide(spec, T0, T0 + 2.5 * H)
    assert every is not None and every.fire == [T0, T0 + H, T0 + 2 * H]
    # catch_up: all under the default overlap (skip): the first fires, and the others
    # meet it running.
    first = _decide(ScheduleSpec(cron="0 * * * *", catch_up="all"), T0, T0 + 2.5 * H)
    assert first is not None and first.fire == [T0] and len(first.skips) == 2


def test_times_older_than_the_catch_up_window_never_fire() -> None:
    spec = ScheduleSpec(cron="0 * * * *", catch_up_window=1000)
    d = _decide(spec, T0, T0 + 2.5 * H)  # 12:00 is 30 minutes old at 12:30
    assert d is not None and d.fire == []
    assert [s.reason for s in d.skips] == ["older than the catch-up window"] * 3
    inside = _decide(ScheduleSpec(cron="0 * * * *", catch_up_window=1800), T0, T0 + 2.5 * H)
    assert inside is not None and inside.fire == [T0 + 2 * H]


def test_overlap_skip() -> None:
    d = _decide(HOURLY, T0, T0 + 1, last_running=True)
    assert d is not None and d.fire == [] and d.next_fire_at == T0 + H
    assert d.skips == [Skip(T0, "the previous run is still running (overlap: skip)")]


def test_overlap_buffer_one_waits_then_fires_when_the_run_ends() -> None:
    spec = ScheduleSpec(cron="0 * * * *", overlap="buffer_one")
    d = _decide(spec, T0, T0 + 1, last_running=True)
    assert d is not None and d.fire == [] and d.buffered == T0
    # The next hour while it still runs: one already waits, this one is skipped.
    d2 = _decide(spec, T0 + H, T0 + H + 1, last_running=True, buffered=T0)
    assert d2 is not None and d2.fire == [] and d2.buffered == T0
    assert "one time already waits" in d2.skips[0].reason
    # The run ended: the buffered time fires (with its own nominal time).
    d3 = _decide(spec, T0 + 2 * H, T0 + H + 30, last_running=False, buffered=T0)
    assert d3 is not None and d3.fire == [T0] and d3.buffered is None


def test_overlap_allow_all_and_cancel_previous() -> None:
    allow = _decide(
        ScheduleSpec(cron="0 * * * *", overlap="allow_all"), T0, T0 + 1, last_running=True
    )
    assert allow is not None and allow.fire == [T0] and allow.cancel is None
    spec = ScheduleSpec(cron="0 * * * *", overlap="cancel_previous")
    cancel = _decide(spec, T0, T0 + 1, last_running=True)
    assert cancel is not None and cancel.fire == [T0] and cancel.cancel == "run_prev"
    quiet = _decide(spec, T0, T0 + 1, last_running=False)
    assert quiet is not None and quiet.cancel is None


def test_jittered_time_waits_for_its_offset() -> None:
    spec = ScheduleSpec(cron="0 * * * *", jitter=600)
    offset = jitter_of("a/s", T0, 600)
    assert _decide(spec, T0, T0 + offset - 0.01) is None
    d = _decide(spec, T0, T0 + offset)
    assert d is not None and d.fire == [T0]


def test_backfill_times_are_the_nominal_times_of_the_range() -> None:
    got = list(backfill_times(HOURLY, T0 - 0.5 * H, T0 + 3 * H))
    assert got == [T0, T0 + H, T0 + 2 * H]


def test_a_buffered_time_still_waiting_decides_nothing() -> None:
    """Nothing due, the buffered time's run still going: no decision, so no write."""
    spec = ScheduleSpec(cron="0 * * * *", overlap="buffer_one")
    assert _decide(spec, T0 + H, T0 + 30, last_running=True, buffered=T0) is None


def test_a_time_jittered_past_the_next_one_is_not_passed_over() -> None:
    """A cron at :00 and :01 with a 10-minute jitter: when :01's moment comes before
    :00's, :01 waits for :00 (times fire in order, catch-up all fires both); no time is
    dropped without a decision."""
    spec = ScheduleSpec(cron="0,1 * * * *", jitter=600, catch_up="all", overlap="allow_all")
    name = next(
        f"a/s{i}"
        for i in range(1000)
        if jitter_of(f"a/s{i}", T0, 600) > jitter_of(f"a/s{i}", T0 + 60, 600) + 60
    )
    early = T0 + 60 + jitter_of(name, T0 + 60, 600)  # :01's moment, before :00's
    args = {"last_run": None, "last_running": False, "buffered": None}
    assert decide(spec, name, next_fire_at=T0, now=early, **args) is None  # type: ignore[arg-type]
    late = T0 + jitter_of(name, T0, 600)
    d = decide(spec, name, next_fire_at=T0, now=late, **args)  # type: ignore[arg-type]
    assert d is not None and d.fire == [T0, T0 + 60] and d.next_fire_at == T0 + H
