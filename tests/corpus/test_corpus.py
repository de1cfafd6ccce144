"""The corpus against the current code, on SQLite and PostgreSQL (see README.md):

(a) re-recording a scenario gives its fixture byte for byte;
(b) the fixture's log, written into a fresh database and driven under the current code,
    replays every recorded step (no model call, no tool executed) and ends as recorded;
(c) for every tick of the corpus, ``toren plan`` run just before it predicted exactly the
    invalidations the tick then wrote; and (b') the plan of each log written in (b), under
    the code that recorded it, finds nothing to re-run.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toren.core.drivers.sticky import StickyRuns

from ..conftest import require_pg
from .backends import BACKENDS, FreshDatabases
from .harness import FIXTURES, REPLAY_FIELDS, Replayed, dump, record, replay
from .scenarios import SCENARIOS

NAMES = sorted(SCENARIOS)

# Scenarios where ``toren plan`` disagrees with the tick on main (findings, see README.md).
# Strict xfail: once the plan agrees, these tests pass and fail as XPASS, and the entry
# goes (and the scenario is re-recorded: its plans change, a documented change).
# What a plan finding and a StreamInvalidated event both say.
FINDING = (
    "stream",
    "from_pos",
    "cause",
    "expected_digest",
    "actual_digest",
    "expected_kind",
    "actual_kind",
)


@pytest.fixture(scope="session")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshDatabases]:
    fresh = FreshDatabases(tmp_path_factory.mktemp("corpus"))
    try:
        yield fresh
    finally:
        fresh.close()


_RECORDED: dict[tuple[str, str], str] = {}


async def recording(dbs: FreshDatabases, name: str, backend: str) -> str:
    """The scenario recorded with the current code (once per session and backend)."""
    if backend == "postgres":
        require_pg()
    key = (name, backend)
    if key not in _RECORDED:
        with dbs.fresh(backend) as url:
            _RECORDED[key] = dump(await record(SCENARIOS[name], url))
    return _RECORDED[key]


def fixture_text(name: str) -> str:
    path = FIXTURES / f"{name}.json"
    assert path.exists(), f"no fixture for scenario {name!r}: record it (README.md)"
    return path.read_text("utf-8")


def test_the_corpus_is_complete() -> None:
    assert len(SCENARIOS) >= 30
    on_disk = {p.stem for p in Path(FIXTURES).glob("*.json")}
    assert on_disk == set(SCENARIOS), "every scenario has a fixture, every fixture a scenario"
    kinds = set()
    for name in NAMES:
        for run in json.loads(fixture_text(name))["runs"].values():
            kinds |= {e["type"] for e in run["events"]}
            causes = {json.loads(e["payload"]).get("cause") for e in run["events"]}
            kinds |= {f"cause:{c}" for c in causes if c}
    for wanted in (
        "ModelCallRecorded",
        "ToolCallRecorded",
        "ValueRecorded",
        "TimerScheduled",
        "TimerFired",
        "MessageReceived",
        "ChildStarted",
        "ChildCompleted",
        "StreamInvalidated",
        "RunWaiting",
        "RunCompleted",
        "RunFailed",
        "RunCancelled",
        "RunRetried",
        "RunForked",
        "cause:digest_mismatch",
        "cause:kind_mismatch",
        "cause:stream_ended",
        "cause:parent_invalidated",
    ):
        assert wanted in kinds, f"no scenario of the corpus records {wanted}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
async def test_rerecording_is_byte_identical(dbs: FreshDatabases, name: str, backend: str) -> None:
    expected = fixture_text(name)
    got = await recording(dbs, name, backend)
    if got != expected:
        diff = difflib.unified_diff(
            expected.splitlines(), got.splitlines(), "fixture", "now", lineterm="", n=3
        )
        shown = "\n".join(list(diff)[:120])
        pytest.fail(
            f"scenario {name} on {backend} no longer records its fixture; differing: "
            f"{', '.join(sections_differing(expected, got))}\n{shown}"
        )


def sections_differing(expected: str, got: str) -> list[str]:
    """Which parts of the document differ: the log and blobs (the byte-identity contract)
    or the tick outcomes, run rows and plans (the engine's other observable behaviour)."""
    a, b = json.loads(expected), json.loads(got)
    out = []
    for name in sorted(set(a["runs"]) | set(b["runs"])):
        run_a, run_b = a["runs"].get(name, {}), b["runs"].get(name, {})
        for part in ("events", "final", "replay_version"):
            if run_a.get(part) != run_b.get(part):
                out.append(f"runs.{name}.{part}")
    out += [k for k in ("blobs", "ticks", "plans", "clock_end", "description") if a[k] != b[k]]
    return out or ["formatting only"]


_REPLAYED: dict[tuple[str, str], Replayed] = {}


async def replayed(dbs: FreshDatabases, name: str, backend: str) -> Replayed:
    """The fixture's log driven under the current code (once per session and backend)."""
    if backend == "postgres":
        require_pg()
    key = (name, backend)
    if key not in _REPLAYED:
        fixture = json.loads(fixture_text(name))
        with dbs.fresh(backend) as url:
            _REPLAYED[key] = await replay(SCENARIOS[name], fixture, url)
    return _REPLAYED[key]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
async def test_the_recorded_log_replays_for_free(
    dbs: FreshDatabases, name: str, backend: str
) -> None:
    fixture = json.loads(fixture_text(name))
    done = await replayed(dbs, name, backend)
    assert done.live_model_calls == 0, "a recorded model call was made again"
    assert done.live_tool_calls == [], "a recorded tool call was executed again"
    for run_name, run in fixture["runs"].items():
        assert done.logs[run_name] == run["events"], f"the log of {run_name} differs"
        final = {k: run["final"][k] for k in REPLAY_FIELDS}
        assert done.finals[run_name] == final, f"{run_name} ended otherwise"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
async def test_the_plan_of_a_recorded_log_is_clean(
    dbs: FreshDatabases, name: str, backend: str
) -> None:
    """Before (b)'s ticks, ``toren plan`` of each loaded log under the code that wrote it
    found nothing to re-run: the plan's half of "every recorded step replays"."""
    done = await replayed(dbs, name, backend)
    for run_name, plan in done.plans.items():
        assert plan == {"findings": [], "problem": None}, f"the plan of {run_name}: {plan}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
async def test_tick_and_plan_agree(dbs: FreshDatabases, name: str, backend: str) -> None:
    doc = json.loads(await recording(dbs, name, backend))
    for entry in doc["plans"]:
        plan: dict[str, Any] | None = entry["plan"]
        if plan is None:  # the run was not in flight: nothing to plan (the tick claims none)
            assert entry["written"] == []
            continue
        predicted = [{k: f[k] for k in FINDING} for f in plan["findings"]]
        assert predicted == entry["written"], (
            f"tick {entry['tick']} of {entry['run']} under {entry['version']}: the plan "
            f"predicted {predicted}, the tick wrote {entry['written']}"
        )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
async def test_a_sticky_worker_writes_the_same_log(
    dbs: FreshDatabases, name: str, backend: str
) -> None:
    """(d) Sticky runs (toren.core.drivers.sticky): the scenario recorded with a cache of
    parked runs, continued in place when the next tick runs the same code, writes the
    fixture's logs and blobs byte for byte and ends every run as recorded. Each tick pays
    for and executes exactly what it did uncached; only what it replays differs (a run
    continued in place replays nothing)."""
    if backend == "postgres":
        require_pg()
    expected = json.loads(fixture_text(name))
    sticky = StickyRuns(64_000_000)
    with dbs.fresh(backend) as url:
        got = json.loads(dump(await record(SCENARIOS[name], url, sticky=sticky)))
    for run_name, run in expected["runs"].items():
        assert got["runs"][run_name]["events"] == run["events"], f"the log of {run_name}"
        assert got["runs"][run_name]["final"] == run["final"], f"{run_name} ended otherwise"
    assert got["blobs"] == expected["blobs"]
    assert got["plans"] == expected["plans"]
    pairs = list(zip(got["ticks"], expected["ticks"], strict=True))
    ticks = [{k: v for k, v in t.items() if k != "replayed"} for t in got["ticks"]]
    assert ticks == [{k: v for k, v in t.items() if k != "replayed"} for t in expected["ticks"]]
    replayed = [(a.get("replayed", 0), b.get("replayed", 0)) for a, b in pairs]
    # Only a tick continued in place replays less than it did uncached (a continued tick
    # whose run had nothing to replay anyway replays 0 both ways).
    assert sum(a < b for a, b in replayed) <= sticky.continued
    assert all(a <= b for a, b in replayed)
