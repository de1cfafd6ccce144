"""The journal alone: no store, no event loop. Event lists are built with the event
dataclasses; every answer of ``Journal.request`` / ``end_stream`` is data."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from toren.core.contract.events import (
    ROOT,
    ChildCompleted,
    ChildStarted,
    Event,
    MessageReceived,
    ModelCallRecorded,
    RunFailed,
    RunForked,
    RunRetried,
    StreamInvalidated,
    TimerScheduled,
    ToolCallRecorded,
    ValueRecorded,
    make_event,
)
from toren.core.contract.journal import (
    NO_GUARD,
    BackOff,
    Journal,
    LiveVersions,
    Replay,
    Run,
    Supersede,
    log_totals,
)
from toren.core.contract.values import InvalidationCause, StepKind, Totals


class Log:
    """Builds a run's events with increasing seqs."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._seq = itertools.count(1)

    def add(
        self,
        stream: str,
        pos: int | None,
        payload: object,
        digest: str | None = None,
        *,
        gen: int = 0,
        cv: str = "A",
    ) -> Event:
        e = make_event(
            "r",
            payload,
            stream=stream,
            position=pos,
            generation=gen,
            digest=digest,
            code_version=cv,
        )
        event = Event(**{**e.__dict__, "seq": next(self._seq)})
        self.events.append(event)
        return event

    def model(self, stream: str, pos: int, digest: str, *, cv: str = "A", tokens: int = 0) -> Event:
        payload = ModelCallRecorded(
            response={"text": digest}, input_tokens=tokens, output_tokens=tokens, cost_usd="0.5"
        )
        return self.add(stream, pos, payload, digest, cv=cv)

    def tool(
        self, stream: str, pos: int, digest: str, result: object = "ok", error: dict | None = None
    ) -> Event:
        payload = ToolCallRecorded(name="t", result=result, error=error)
        return self.add(stream, pos, payload, digest)

    def spawn(self, stream: str, pos: int, digest: str = "spawn", *, cv: str = "A") -> str:
        child = f"{stream}/{pos}"
        self.add(stream, pos, ChildStarted(process="p", child_stream=child), digest, cv=cv)
        return child

    def journal(self) -> Journal:
        return Journal.fold("r", self.events)


def ask(j: Journal, stream: str, pos: int, kind: str, digest: str, **kw: object) -> object:
    return j.request(stream, pos, kind, digest, code_version="B", **kw)  # type: ignore[arg-type]


# -- replay, run, supersede ------------------------------------------------------------


def test_replay_run_and_supersede_by_digest_and_kind() -> None:
    log = Log()
    log.model("main", 0, "d0")
    log.model("main", 1, "d1")
    j = log.journal()
    assert ask(j, "main", 0, StepKind.MODEL, "d0") == Replay(j.streams["main"].steps[0])
    assert ask(j, "main", 2, StepKind.MODEL, "d2") == Run(0)
    kind = ask(j, "main", 0, StepKind.TOOL, "d0")
    assert isinstance(kind, Supersede) and kind.cause == InvalidationCause.KIND_MISMATCH
    assert kind.payload == StreamInvalidated(
        from_pos=0,
        expected_digest="d0",
        actual_digest="d0",
        expected_kind="model",
        actual_kind="tool",
        code_version="B",
        cause="kind_mismatch",
    )
    assert kind.run == Run(1)  # the step runs live in the new generation
    assert [s.digest for s in kind.superseded] == ["d0", "d1"]
    assert j.streams["main"].steps == {}


def test_digest_mismatch_payload_is_what_the_tick_writes() -> None:
    log = Log()
    log.model("main", 0, "d0")
    log.model("main", 1, "d1")
    j = log.journal()
    answer = ask(j, "main", 1, StepKind.MODEL, "other")
    assert isinstance(answer, Supersede)
    (inv,) = answer.invalidations
    assert (inv.stream, inv.generation, inv.slot) == ("main", 0, "main#0:inv")
    assert inv.payload.cause == "digest_mismatch" and type(inv.payload.cause) is str
    assert inv.payload.actual_kind == "model" and type(inv.payload.actual_kind) is str
    assert answer.expected is not None and answer.expected.digest == "d1"
    assert list(j.streams["main"].steps) == [0]


def test_nested_children_are_invalidated_with_their_parent() -> None:
    log = Log()
    log.model("main", 0, "m0")
    child = log.spawn("main", 1)
    log.model(child, 0, "c0")
    grandchild = log.spawn(child, 1)
    log.tool(grandchild, 0, "g0")
    empty = log.spawn(child, 2)  # started, never stepped: nothing to invalidate
    log.add(child, 2, ChildCompleted(output=None), "spawn")
    j = log.journal()
    answer = ask(j, "main", 0, StepKind.MODEL, "changed")
    assert isinstance(answer, Supersede)
    assert [(i.stream, i.payload.from_pos, i.payload.cause) for i in answer.invalidations] == [
        ("main", 0, "digest_mismatch"),
        (child, 0, "parent_invalidated"),
        (grandchild, 0, "parent_invalidated"),
    ]
    assert all(i.payload.code_version == "B" for i in answer.invalidations)
    assert answer.invalidations[2].payload == StreamInvalidated(
        from_pos=0, code_version="B", cause="parent_invalidated"
    )
    assert empty not in {i.stream for i in answer.invalidations}
    assert len(answer.superseded) == 2 + 3 + 1
    for name in ("main", child, grandchild):
        assert j.streams[name].steps == {} and j.streams[name].generation == 1


def test_a_spawn_after_the_cut_keeps_other_children() -> None:
    log = Log()
    kept = log.spawn("main", 0)
    log.model(kept, 0, "k0")
    gone = log.spawn("main", 1)
    log.model(gone, 0, "x0")
    j = log.journal()
    answer = ask(j, "main", 1, StepKind.CHILD, "other-spawn")
    assert isinstance(answer, Supersede)
    assert [i.stream for i in answer.invalidations] == ["main", gone]
    assert list(j.streams[kept].steps) == [0]


def test_end_stream_supersedes_the_tail() -> None:
    log = Log()
    for pos in range(3):
        log.model("main", pos, f"d{pos}")
    j = log.journal()
    assert j.end_stream("main", 3, code_version="B") is None
    assert j.end_stream("nowhere", 0, code_version="B") is None
    answer = j.end_stream("main", 1, code_version="B")
    assert isinstance(answer, Supersede) and answer.run is None
    assert answer.payload == StreamInvalidated(from_pos=1, code_version="B", cause="stream_ended")
    assert list(j.streams["main"].steps) == [0]
    assert j.end_stream("main", 1, code_version="B") is None


# -- reuse claims ----------------------------------------------------------------------


def test_nth_to_nth_tool_reuse() -> None:
    log = Log()
    log.model("main", 0, "m0")
    first = log.tool("main", 1, "send")
    log.tool("main", 2, "other")
    second = log.tool("main", 3, "send")
    log.tool("main", 4, "send", result=None, error={"message": "boom"})  # failed: not reused
    j = log.journal()
    assert isinstance(ask(j, "main", 0, StepKind.MODEL, "m0-edited"), Supersede)
    one = ask(j, "main", 1, StepKind.TOOL, "send")
    two = ask(j, "main", 2, StepKind.TOOL, "send")
    three = ask(j, "main", 3, StepKind.TOOL, "send")
    assert isinstance(one, Run) and one.reuse is not None and one.reuse.first.seq == first.seq
    assert isinstance(two, Run) and two.reuse is not None and two.reuse.first.seq == second.seq
    assert three == Run(1)
    assert ask(j, "main", 4, StepKind.TOOL, "other", reusable=False) == Run(1)


def test_reuse_is_claimed_by_the_supersede_answer_itself() -> None:
    log = Log()
    sent = log.tool("main", 0, "send")
    j = log.journal()
    answer = ask(j, "main", 0, StepKind.MODEL, "new-first-step")
    assert isinstance(answer, Supersede) and answer.run == Run(1)
    moved = ask(j, "main", 1, StepKind.TOOL, "send")
    assert isinstance(moved, Run) and moved.reuse is not None
    assert moved.reuse.first.seq == sent.seq


def test_reuse_across_a_spawn_that_moved() -> None:
    log = Log()
    log.model("main", 0, "m0")
    old = log.spawn("main", 1, "spawn-x")
    a = log.tool(old, 0, "send")
    b = log.tool(old, 1, "send")
    j = log.journal()
    assert isinstance(ask(j, "main", 0, StepKind.MODEL, "m0-edited"), Supersede)
    assert ask(j, "main", 1, StepKind.MODEL, "extra") == Run(1)
    spawn = ask(j, "main", 2, StepKind.CHILD, "spawn-x")
    assert spawn == Run(1, continues=old)
    new = "main/2"
    got = [ask(j, new, i, StepKind.TOOL, "send") for i in range(3)]
    assert [r.reuse.first.seq if isinstance(r, Run) and r.reuse else None for r in got] == [
        a.seq,
        b.seq,
        None,
    ]
    # The superseded child is continued once: a second identical spawn starts afresh.
    assert ask(j, "main", 3, StepKind.CHILD, "spawn-x") == Run(1)


def test_reuse_claims_survive_the_next_fold() -> None:
    log = Log()
    sent = log.tool("main", 0, "send")
    log.add("main", None, StreamInvalidated(from_pos=0, cause="digest_mismatch"))
    log.add(
        "main", 0, ToolCallRecorded(name="t", result="ok", reused_from_seq=sent.seq), "send", gen=1
    )
    j = log.journal()
    assert ask(j, "main", 1, StepKind.TOOL, "send") == Run(1)


def test_message_redelivery() -> None:
    log = Log()
    log.add("main", 0, MessageReceived(name="approve", payload={"ok": 1}, inbox_id=7), "wait")
    log.add("main", 1, MessageReceived(name="approve", payload={"ok": 2}, inbox_id=9), "wait")
    j = log.journal()
    assert j.redeliverable("approve") is None  # every message is held by a live step
    assert isinstance(ask(j, "main", 0, StepKind.MODEL, "new"), Supersede)
    again = j.redeliverable("approve")
    assert again is not None and again.inbox_id == 7  # the oldest first
    assert j.redeliverable("other") is None
    event = make_event(
        "r", again, stream="main", position=1, generation=1, digest="wait", code_version="B"
    )
    j.recorded([Event(**{**event.__dict__, "seq": 50})])
    after = j.redeliverable("approve")
    assert after is not None and after.inbox_id == 9


# -- the storm guard -------------------------------------------------------------------


def _written_by_a() -> Journal:
    log = Log()
    log.model("main", 0, "d0", cv="A")
    return log.journal()


def test_storm_guard_rollout_and_rollback() -> None:
    # Rollout: B (the old version) meets a suffix of A whose workers started later.
    j = _written_by_a()
    newer_a = LiveVersions({"A": 200.0, "B": 100.0}, started_at=50.0)
    answer = ask(j, "main", 0, StepKind.MODEL, "x", live_versions=newer_a)
    assert answer == BackOff("A", "main", 0)
    assert list(j.streams["main"].steps) == [0]  # nothing changed
    # Rollback: B's workers are the most recently started: B wins.
    newer_b = LiveVersions({"A": 200.0, "B": 300.0}, started_at=50.0)
    assert isinstance(ask(j, "main", 0, StepKind.MODEL, "x", live_versions=newer_b), Supersede)


def test_storm_guard_uses_the_workers_own_start_when_its_version_is_unlisted() -> None:
    j = _written_by_a()
    early = LiveVersions({"A": 200.0}, started_at=100.0)
    assert isinstance(ask(j, "main", 0, StepKind.MODEL, "x", live_versions=early), BackOff)
    late = LiveVersions({"A": 200.0}, started_at=250.0)
    assert isinstance(ask(j, "main", 0, StepKind.MODEL, "x", live_versions=late), Supersede)


def test_storm_guard_ignores_dead_versions_and_no_guard() -> None:
    assert isinstance(ask(_written_by_a(), "main", 0, "model", "x"), Supersede)
    gone = LiveVersions({"C": 900.0, "B": 1.0})
    assert isinstance(ask(_written_by_a(), "main", 0, "model", "x", live_versions=gone), Supersede)


def test_storm_guard_covers_descendant_streams_and_end_stream() -> None:
    log = Log()
    log.model("main", 0, "m0", cv="B")
    child = log.spawn("main", 1, cv="B")
    log.model(child, 0, "c0", cv="A")
    live = LiveVersions({"A": 200.0, "B": 100.0})
    j = log.journal()
    assert ask(j, "main", 1, StepKind.CHILD, "other", live_versions=live) == BackOff("A", "main", 1)
    assert j.end_stream("main", 1, code_version="B", live_versions=live) == BackOff("A", "main", 1)
    assert list(j.streams[child].steps) == [0]


# -- forks and retries -----------------------------------------------------------------


def test_pinned_fork_prefix_replays_any_digest_but_not_another_kind() -> None:
    log = Log()
    log.add(ROOT, None, RunForked(source_run="src", stream="main", position=2, pins={"main": 2}))
    log.model("main", 0, "old0")
    log.model("main", 1, "old1")
    log.model("main", 2, "old2")
    j = log.journal()
    assert isinstance(ask(j, "main", 0, StepKind.MODEL, "new0"), Replay)
    assert isinstance(ask(j, "main", 1, StepKind.MODEL, "new1"), Replay)
    assert isinstance(ask(j, "main", 2, StepKind.MODEL, "new2"), Supersede)  # past the pin
    j = log.journal()
    answer = ask(j, "main", 1, StepKind.TOOL, "new1")
    assert isinstance(answer, Supersede) and answer.cause == InvalidationCause.KIND_MISMATCH
    assert j.streams["main"].pinned == 1


def test_a_retry_reruns_the_failed_step_under_the_next_slots() -> None:
    log = Log()
    log.model("main", 0, "d0")
    failed = log.tool("main", 1, "t1", result=None, error={"message": "down"})
    log.add(ROOT, None, RunFailed(error={"message": "down"}, failed_seqs=[failed.seq]))
    log.add(ROOT, None, RunRetried(attempt=1, retried_seqs=[failed.seq]))
    j = log.journal()
    assert j.retries == 1 and j.terminal is None
    assert isinstance(ask(j, "main", 0, StepKind.MODEL, "d0"), Replay)
    assert ask(j, "main", 1, StepKind.TOOL, "t1") == Run(0)


# -- recorded and usage ----------------------------------------------------------------


def test_usage_is_replay_exact() -> None:
    log = Log()
    log.model("main", 0, "d0", tokens=10)
    log.add("main", 1, ValueRecorded(what="now", value=1.0), "v")
    log.model("main", 2, "d2", tokens=5)
    j = log.journal()
    assert j.usage_at() == Totals()
    ask(j, "main", 0, StepKind.MODEL, "d0")
    assert j.usage_at() == Totals(10, 10, 500_000_000, 0, 1)
    ask(j, "main", 1, StepKind.VALUE, "v")
    assert j.usage_at().steps == 2
    assert j.spent() == Totals(15, 15, 1_000_000_000, 0, 3)
    assert log_totals(log.events) == Totals(15, 15, 1_000_000_000, 0, 3, 0)


def test_recorded_folds_steps_and_counts_invalidations_once() -> None:
    log = Log()
    log.model("main", 0, "d0")
    j = log.journal()
    answer = ask(j, "main", 0, StepKind.MODEL, "d1")
    assert isinstance(answer, Supersede)
    stored = [
        make_event("r", i.payload, stream=i.stream, generation=i.generation, slot=i.slot)
        for i in answer.invalidations
    ]
    j.recorded([Event(**{**e.__dict__, "seq": 10}) for e in stored])
    assert j.streams["main"].generation == 1  # not truncated twice
    assert j.seen_seq == 0
    step = make_event(
        "r", ModelCallRecorded(), stream="main", position=0, generation=1, digest="d1"
    )
    j.recorded([Event(**{**step.__dict__, "seq": 11})])
    assert isinstance(ask(j, "main", 0, StepKind.MODEL, "d1"), Replay)
    assert j.seen_seq == 11 and j.usage.final().invalidations == 1


def test_two_phase_steps_replay_incomplete() -> None:
    log = Log()
    log.add("main", 0, TimerScheduled(fire_at=5.0, seconds=5.0), "sleep")
    j = log.journal()
    answer = ask(j, "main", 0, StepKind.SLEEP, "sleep")
    assert isinstance(answer, Replay) and not answer.step.complete


# -- properties ------------------------------------------------------------------------

digests = st.sampled_from(["a", "b", "c", "d"])


@settings(max_examples=200, deadline=None)
@given(recorded=st.lists(digests, max_size=8), asked=st.lists(digests, max_size=8))
def test_property_one_stream(recorded: list[str], asked: list[str]) -> None:
    """Replaying the same requests replays everything; any other request sequence
    replays the common prefix, supersedes once at the first difference, and runs the
    rest live; views never keep a position at or past the cut."""
    log = Log()
    for pos, d in enumerate(recorded):
        log.model("main", pos, d)
    j = log.journal()
    answers = [ask(j, "main", pos, StepKind.MODEL, d) for pos, d in enumerate(asked)]
    end = j.end_stream("main", len(asked), code_version="B")
    common = next(
        (i for i, (x, y) in enumerate(zip(recorded, asked, strict=False)) if x != y),
        min(len(recorded), len(asked)),
    )
    assert all(isinstance(a, Replay) for a in answers[:common])
    supersedes = [a for a in [*answers, end] if isinstance(a, Supersede)]
    if recorded[:common] == recorded and len(asked) >= len(recorded):
        assert supersedes == []
    else:
        assert len(supersedes) == 1 and supersedes[0].from_pos == common
        assert [s.digest for s in supersedes[0].superseded] == recorded[common:]
    assert all(isinstance(a, (Run, Supersede)) for a in answers[common:])
    assert sorted(j.log.stream("main").steps) == list(range(min(common, len(recorded))))


@settings(max_examples=200, deadline=None)
@given(
    old=st.lists(st.tuples(digests, st.booleans()), max_size=8),
    new=st.lists(digests, max_size=8),
)
def test_property_nth_to_nth_reuse(old: list[tuple[str, bool]], new: list[str]) -> None:
    """After an invalidation the k-th new call of digest d reuses the k-th successful
    superseded call of d, and no recorded call is reused twice."""
    log = Log()
    log.model("main", 0, "first")
    seqs: dict[str, list[int]] = {}
    for pos, (d, ok) in enumerate(old, start=1):
        e = log.tool("main", pos, d, error=None if ok else {"message": "x"})
        if ok:
            seqs.setdefault(d, []).append(e.seq)
    j = log.journal()
    assert isinstance(ask(j, "main", 0, StepKind.MODEL, "edited"), Supersede)
    seen: Counter[str] = Counter()
    claimed: list[int] = []
    for pos, d in enumerate(new, start=1):
        answer = ask(j, "main", pos, StepKind.TOOL, d)
        assert isinstance(answer, Run)
        expected = seqs.get(d, [])
        n = seen[d]
        seen[d] += 1
        if n < len(expected):
            assert answer.reuse is not None and answer.reuse.first.seq == expected[n]
            claimed.append(answer.reuse.first.seq)
        else:
            assert answer.reuse is None
    assert len(claimed) == len(set(claimed))


@settings(max_examples=200, deadline=None)
@given(
    writers=st.lists(st.sampled_from(["A", "B", "C"]), min_size=1, max_size=5),
    starts=st.dictionaries(st.sampled_from(["A", "B", "C"]), st.floats(0, 100), max_size=3),
    started_at=st.floats(0, 100),
)
def test_property_storm_guard(
    writers: list[str], starts: dict[str, float], started_at: float
) -> None:
    """Version B backs off exactly when some other version that wrote the suffix has a
    live worker started after B's newest (or after this worker, if B has none listed);
    backing off changes nothing."""
    log = Log()
    for pos, cv in enumerate(writers):
        log.model("main", pos, f"d{pos}", cv=cv)
    j = log.journal()
    live = LiveVersions(starts, started_at=started_at)
    mine = starts.get("B", started_at)
    newer = {v for v in writers if v != "B" and v in starts and starts[v] > mine}
    answer = ask(j, "main", 0, StepKind.MODEL, "changed", live_versions=live)
    if newer:
        assert isinstance(answer, BackOff) and answer.newer_version in newer
        assert sorted(j.streams["main"].steps) == list(range(len(writers)))
    else:
        assert isinstance(answer, Supersede)
    # Without the guard the same request always supersedes.
    unguarded = ask(log.journal(), "main", 0, "model", "changed", live_versions=NO_GUARD)
    assert isinstance(unguarded, Supersede)


@st.composite
def trees(draw: st.DrawFn, stream: str = "main", depth: int = 0) -> list[tuple[str, int, str]]:
    """A run's steps as (stream, position, 'model'|'child') with nested children."""
    out: list[tuple[str, int, str]] = []
    for pos in range(draw(st.integers(0, 4))):
        if depth < 3 and draw(st.booleans()):
            out.append((stream, pos, "child"))
            out.extend(draw(trees(f"{stream}/{pos}", depth + 1)))
        else:
            out.append((stream, pos, "model"))
    return out


@settings(max_examples=200, deadline=None)
@given(tree=trees(), cut=st.integers(0, 4))
def test_property_nested_invalidation(tree: list[tuple[str, int, str]], cut: int) -> None:
    """Cutting the root stream invalidates exactly the descendant streams started at or
    after the cut that hold steps, each from 0 and after its parent."""
    log = Log()
    for stream, pos, kind in tree:
        if kind == "child":
            log.spawn(stream, pos)
        else:
            log.model(stream, pos, f"{stream}:{pos}")
    j = log.journal()
    root = [p for s, p, _ in tree if s == "main"]
    answer = j.end_stream("main", cut, code_version="B")
    if cut >= len(root):
        assert answer is None
        return
    assert isinstance(answer, Supersede)
    cut_roots = {f"main/{p}" for s, p, k in tree if s == "main" and p >= cut and k == "child"}

    def under(name: str) -> bool:
        return any(name == r or name.startswith(r + "/") for r in cut_roots)

    with_steps = {s for s, _, _ in tree if s != "main"}
    expected = {s for s in with_steps if under(s)}
    names = [i.stream for i in answer.invalidations]
    assert names[0] == "main" and set(names[1:]) == expected and len(names) == len(set(names))
    for i in answer.invalidations[1:]:
        assert i.payload.cause == "parent_invalidated" and i.payload.from_pos == 0
        parent = i.stream.rsplit("/", 1)[0]
        assert parent in names[: names.index(i.stream)]
    for name in expected:
        assert j.streams[name].steps == {}
    for name in with_steps - expected:
        assert j.streams[name].steps
