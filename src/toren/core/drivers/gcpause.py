"""The cycle collector paused while ticks replay (:class:`ReplayGcPause`)."""

from __future__ import annotations

import gc

__all__ = ["FREEZE_ABOVE", "THAWED_FULL_PASS", "ReplayGcPause"]

# Young objects (allocated since the collector last ran, still alive) above which the end
# of a pause sets them aside (gc.freeze) instead of letting the collector scan them: a
# 10,000-step replay leaves ~60,000, a 20-step one a few hundred.
FREEZE_ABOVE = 20_000
# Objects given back from freezes after which the next pause runs one full collection.
THAWED_FULL_PASS = 1_000_000


class ReplayGcPause:
    """Pauses Python's cycle collector while ticks replay.

    A replay builds one object graph per recorded event (a 10,000-step run: ~50,000
    containers) and keeps it; the collector would re-scan that growing heap again and
    again while the agent code re-runs, a third of the replay's time. The objects are
    acyclic (reference counting frees them), so pausing the collector from the start of a
    tick until its first live step loses nothing. The collector is process-wide, hence one
    count shared by every tick of the process; it comes back on when no tick replays.

    Turned back on after a long replay, the collector's first pass would scan every object
    the replay made (all young and still alive: ~20 ms of a 10,000-step replay's ~250),
    then scan them again as they age. So a pause that leaves more than ``FREEZE_ABOVE``
    young objects sets them aside first (``gc.freeze``: the collector skips them;
    reference counting still frees them), unless the host froze objects of its own. The
    next pause gives them back to the oldest generation (``gc.unfreeze``), the pause after
    one that froze never freezes, and once ``THAWED_FULL_PASS`` objects have been given
    back a pause starts with one full collection: a garbage cycle among them is collected
    later, never kept for good.
    """

    _replaying = 0
    _was_enabled = True
    _frozen = 0  # objects the last pause set aside, not yet given back
    _froze_last = False  # the last pause to end froze (the next one does not)
    _thawed = 0  # objects given back since the last full collection

    @classmethod
    def begin(cls) -> None:
        if cls._replaying == 0:
            cls._thaw()
            cls._was_enabled = gc.isenabled()
            gc.disable()
        cls._replaying += 1

    @classmethod
    def end(cls) -> None:
        cls._replaying -= 1
        if cls._replaying == 0 and cls._was_enabled:
            if (
                gc.get_count()[0] > FREEZE_ABOVE
                and not cls._froze_last
                and gc.get_freeze_count() == 0  # a host's own gc.freeze(): left alone
            ):
                gc.freeze()
                cls._frozen = gc.get_freeze_count()
                cls._froze_last = True
            else:
                cls._froze_last = False
            gc.enable()

    @classmethod
    def _thaw(cls) -> None:
        if cls._frozen:
            gc.unfreeze()
            cls._thawed += cls._frozen
            cls._frozen = 0
            if cls._thawed >= THAWED_FULL_PASS:
                cls._thawed = 0
                gc.collect()
