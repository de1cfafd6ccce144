"""The pure replay core: folding events into views and deciding steps. No I/O."""

from __future__ import annotations

from toren.core.contract.events import (
    ChildStarted,
    Event,
    ModelCallRecorded,
    RunStarted,
    StreamInvalidated,
    TimerFired,
    TimerScheduled,
    ToolCallRecorded,
    UnknownEvent,
    make_event,
)
from toren.core.contract.replay import (
    Invalidate,
    Live,
    Replay,
    RunLog,
    decide,
    descendants,
    reusable_tool,
)

_seq = iter(range(1, 10_000))


def ev(
    stream: str, pos: int | None, payload, digest: str | None = None, gen: int = 0, cv: str = "A"
) -> Event:
    e = make_event(
        "r", payload, stream=stream, position=pos, generation=gen, digest=digest, code_version=cv
    )
    return Event(**{**e.__dict__, "seq": next(_seq)})


def model(pos: int, digest: str, stream: str = "main") -> Event:
    return ev(stream, pos, ModelCallRecorded(response={"text": digest}), digest)


def tool(pos: int, digest: str, result: object = "ok", error: dict | None = None) -> Event:
    return ev("main", pos, ToolCallRecorded(name="t", result=result, error=error), digest)


def invalidate(stream: str, from_pos: int) -> Event:
    return ev(stream, None, StreamInvalidated(from_pos=from_pos))


def test_fold_builds_views_per_stream() -> None:
    log = RunLog.fold(
        "r",
        [
            ev("", None, RunStarted(agent="a")),
            model(0, "d0"),
            model(1, "d1"),
            model(0, "c0", stream="main/1"),
        ],
    )
    assert log.started is not None and log.started.agent == "a"
    assert sorted(log.streams) == ["main", "main/1"]
    assert [s.digest for _, s in sorted(log.streams["main"].steps.items())] == ["d0", "d1"]


def test_decide_replay_live_invalidate() -> None:
    log = RunLog.fold("r", [model(0, "d0"), model(1, "d1")])
    view = log.streams["main"]
    assert isinstance(decide(view, 0, "model", "d0"), Replay)
    assert isinstance(decide(view, 2, "model", "d2"), Live)
    changed = decide(view, 1, "model", "other")
    assert (
        isinstance(changed, Invalidate)
        and changed.from_pos == 1
        and changed.expected.digest == "d1"
    )
    kind = decide(view, 0, "tool", "d0")
    assert isinstance(kind, Invalidate)  # same digest, different kind: still a mismatch


def test_invalidation_truncates_the_view_but_not_the_log() -> None:
    events = [
        model(0, "d0"),
        model(1, "d1"),
        model(2, "d2"),
        invalidate("main", 1),
        model(
            1,
            "n1",
        ),
    ]
    log = RunLog.fold("r", events)
    view = log.streams["main"]
    assert {p: s.digest for p, s in view.steps.items()} == {0: "d0", 1: "n1"}
    assert [s.digest for s in view.superseded] == ["d1", "d2"]
    assert view.generation == 1 and view.invalidations == 1


def test_two_phase_steps() -> None:
    sched = ev("main", 0, TimerScheduled(fire_at=10.0), "s")
    log = RunLog.fold("r", [sched])
    assert not log.streams["main"].steps[0].complete
    log.apply(ev("main", 0, TimerFired(fired_at=10.0), "s"))
    step = log.streams["main"].steps[0]
    assert step.complete and step.kind == "sleep"


def test_reuse_matches_nth_occurrence_and_skips_failures() -> None:
    events = [
        tool(0, "send", result=1),
        tool(1, "send", error={"message": "boom"}),
        tool(2, "send", result=3),
        invalidate("main", 0),
    ]
    log = RunLog.fold("r", events)
    first = reusable_tool(log, "main", "send")
    assert first is not None and first.first.payload.result == 1
    log.reused_seqs.add(first.first.seq)
    second = reusable_tool(log, "main", "send")
    assert second is not None and second.first.payload.result == 3  # the failed one is skipped
    log.reused_seqs.add(second.first.seq)
    assert reusable_tool(log, "main", "send") is None
    assert reusable_tool(log, "main", "other") is None


def test_reuse_is_counted_from_the_log_across_ticks() -> None:
    first = tool(0, "send", result=1)
    reused = ev(
        "main", 0, ToolCallRecorded(name="t", result=1, reused_from_seq=first.seq), "send", gen=1
    )
    log = RunLog.fold("r", [first, invalidate("main", 0), reused])
    assert reusable_tool(log, "main", "send") is None


def test_descendants_follow_children_recursively() -> None:
    events = [
        ev("main", 0, ChildStarted(process="c", child_stream="main/0"), "c0"),
        ev("main/0", 0, ChildStarted(process="g", child_stream="main/0/0"), "g0"),
        model(0, "x", stream="main/0/0"),
    ]
    log = RunLog.fold("r", events)
    assert descendants(log, ["main/0"]) == ["main/0", "main/0/0"]


def test_unknown_events_are_kept_and_ignored() -> None:
    odd = ev("main", 3, UnknownEvent(raw={"x": 1}))
    odd = Event(**{**odd.__dict__, "type": "FromTheFuture"})
    log = RunLog.fold("r", [model(0, "d0"), odd])
    assert list(log.streams["main"].steps) == [0]


def test_the_replay_gc_pause_is_shared_and_restores_the_collector() -> None:
    import gc

    from toren.core.drivers.tickstate import ReplayGcPause

    assert gc.isenabled()
    ReplayGcPause.begin()
    ReplayGcPause.begin()  # two ticks replaying at once
    assert not gc.isenabled()
    ReplayGcPause.end()
    assert not gc.isenabled()  # the other tick still replays
    ReplayGcPause.end()
    assert gc.isenabled()
    gc.disable()  # a host that runs without the collector keeps it off
    try:
        ReplayGcPause.begin()
        ReplayGcPause.end()
        assert not gc.isenabled()
    finally:
        gc.enable()
