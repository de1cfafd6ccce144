"""The cycle collector's pause around replays: a long replay's objects are set aside
(gc.freeze) rather than scanned when the collector comes back, and given back later, so a
garbage cycle among them is still collected (toren.core.drivers.gcpause)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from toren.core.drivers import gcpause
from toren.core.drivers.gcpause import FREEZE_ABOVE, ReplayGcPause


def _reset() -> None:
    gc.unfreeze()
    ReplayGcPause._replaying = 0
    ReplayGcPause._was_enabled = True
    ReplayGcPause._frozen = 0
    ReplayGcPause._froze_last = False
    ReplayGcPause._thawed = 0
    ReplayGcPause._host_froze = False
    gc.enable()


@pytest.fixture(autouse=True)
def _fresh_pause() -> Iterator[None]:
    """Each test starts and ends with no pause, nothing frozen, the collector on and no
    young objects (the pause's state is process-wide, shared with every other test of
    this process)."""
    thresholds = gc.get_threshold()
    _reset()
    gc.collect()
    yield
    gc.set_threshold(*thresholds)
    _reset()


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _garbage_cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def _replay(objects: int) -> list[list[int]]:
    """A pause during which ``objects`` young containers are made and kept, as a replay
    keeps its log's."""
    ReplayGcPause.begin()
    kept = [[i] for i in range(objects)]
    ReplayGcPause.end()
    return kept


def test_a_long_replay_sets_its_objects_aside_and_the_next_pause_gives_them_back() -> None:
    kept = _replay(FREEZE_ABOVE + 10_000)
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(kept)  # not scanned by the collector's next pass
    ReplayGcPause.begin()
    assert gc.get_freeze_count() == 0  # back in the oldest generation
    ReplayGcPause.end()


def test_a_short_replay_freezes_nothing() -> None:
    _replay(100)
    assert gc.get_freeze_count() == 0


def test_the_pause_after_a_freeze_never_freezes() -> None:
    first = _replay(FREEZE_ABOVE + 10_000)
    assert gc.get_freeze_count() >= len(first)
    second = _replay(FREEZE_ABOVE + 10_000)  # its begin gave the first one's back
    assert gc.get_freeze_count() == 0
    third = _replay(FREEZE_ABOVE + 10_000)
    assert gc.get_freeze_count() >= len(third) > 0
    del second


def test_a_hosts_own_freeze_is_left_alone() -> None:
    host = [[i] for i in range(10)]
    gc.freeze()
    frozen = gc.get_freeze_count()
    assert frozen >= len(host)
    _replay(FREEZE_ABOVE + 10_000)
    # Nothing more frozen (that would add 30,000), nothing of the host's given back
    # (that would leave none; a frozen object may die meanwhile, hence not ==).
    assert frozen // 2 < gc.get_freeze_count() <= frozen
    _replay(100)
    assert frozen // 2 < gc.get_freeze_count() <= frozen
    gc.unfreeze()
    _replay(FREEZE_ABOVE + 10_000)
    assert gc.get_freeze_count() == 0  # a host that froze once is left alone for good


def test_only_what_the_pause_made_counts_and_a_host_without_collections_is_left_alone() -> None:
    young = [[i] for i in range(FREEZE_ABOVE + 10_000)]  # made before the pause
    _replay(100)
    assert gc.get_freeze_count() == 0
    del young
    gc.set_threshold(0)  # no automatic collection at all
    _replay(FREEZE_ABOVE + 10_000)
    assert gc.get_freeze_count() == 0


def test_a_garbage_cycle_set_aside_is_collected_once_given_back() -> None:
    ReplayGcPause.begin()
    cycle = _garbage_cycle()  # garbage now, found only by the collector
    kept = [[i] for i in range(FREEZE_ABOVE + 10_000)]
    ReplayGcPause.end()
    gc.collect()
    assert cycle() is not None  # set aside: the collector skipped it
    ReplayGcPause.begin()
    ReplayGcPause.end()
    gc.collect()
    assert cycle() is None
    del kept


def test_enough_objects_given_back_start_a_pause_with_a_full_collection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gcpause, "THAWED_FULL_PASS", FREEZE_ABOVE)
    ReplayGcPause.begin()
    cycle = _garbage_cycle()
    kept = [[i] for i in range(FREEZE_ABOVE + 10_000)]
    ReplayGcPause.end()
    assert cycle() is not None
    ReplayGcPause.begin()  # gives back more than THAWED_FULL_PASS: collects at once
    assert cycle() is None
    ReplayGcPause.end()
    del kept
