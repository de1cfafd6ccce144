"""The cycle collector paused while ticks replay (:class:`ReplayGcPause`)."""

from __future__ import annotations

import gc
import threading

__all__ = ["FREEZE_ABOVE", "THAWED_FULL_PASS", "ReplayGcPause"]

# Objects a pause made (young, still alive when it ends) above which its end sets the
# young objects aside (gc.freeze) instead of letting the collector scan them: a 10,000-step
# replay makes ~60,000, a 20-step one a few hundred.
FREEZE_ABOVE = 20_000
# Young objects given back from freezes after which the next pause starts with one full
# collection.
THAWED_FULL_PASS = 1_000_000


class ReplayGcPause:
    """Pauses Python's cycle collector while ticks replay.

    A replay builds one object graph per recorded event (a 10,000-step run: ~50,000
    containers) and keeps it; the collector would re-scan that growing heap again and
    again while the agent code re-runs, a third of the replay's time. The objects are
    acyclic (reference counting frees them), so pausing the collector from the start of a
    tick until its first live step loses nothing. The collector is process-wide, hence one
    count shared by every tick of the process; it comes back on when no tick replays.

    Turned back on after a long replay, the collector's next pass would scan every young
    object, the replay's among them (~20 ms of a 10,000-step replay's ~250), then scan
    them again as they age. So a pause that made more than ``FREEZE_ABOVE`` objects moves
    every tracked object aside first (``gc.freeze()``, constant time: the collector skips
    them; reference counting still frees them). The next pause gives them back, into the
    oldest generation (``gc.unfreeze()``); the pause after one that froze never freezes;
    and once ``THAWED_FULL_PASS`` young objects have been given back, a pause starts with
    one full collection. So a garbage cycle among them (a traceback holding frames, say)
    is collected later, never kept for good; it waits at most until the next tick's
    replay, or that full pass. Left alone: a host that froze objects itself before the
    pause (nothing is frozen then), whose collector is off, or whose threshold is 0 (no
    automatic collection). A host that calls ``gc.freeze()`` while the objects of a pause
    are set aside gets its own objects given back with them (``gc.unfreeze()`` is all or
    nothing); ``pause_gc_on_replay=False`` turns all of this off.
    """

    _replaying = 0
    _was_enabled = True
    _young_at_begin = 0  # the collector's young count when the pause began
    _frozen = 0  # young objects the last pause set aside, not yet given back
    _froze_last = False  # the last pause to end froze (the next one does not)
    _thawed = 0  # young objects given back since the last full collection
    _host_froze = False  # objects were frozen by someone else: never freeze again
    # Ticks and plans may replay on several threads' event loops (a server beside a
    # worker): the count is changed under a lock, or a lost update would leave the
    # collector off for good.
    _lock = threading.RLock()  # reentrant: a finalizer run by a collection may replay too

    @classmethod
    def begin(cls) -> None:
        with cls._lock:
            if cls._replaying == 0:
                cls._thaw()
                cls._was_enabled = gc.isenabled()
                gc.disable()
                cls._young_at_begin = gc.get_count()[0]
            cls._replaying += 1

    @classmethod
    def end(cls) -> None:
        with cls._lock:
            cls._replaying -= 1
            if cls._replaying == 0 and cls._was_enabled:
                young = gc.get_count()[0]
                if (
                    young - cls._young_at_begin > FREEZE_ABOVE
                    and not cls._froze_last
                    and not cls._host_froze
                    and gc.get_threshold()[0] > 0
                    and not cls._host_freezes()
                ):
                    gc.freeze()
                    cls._frozen = young
                    cls._froze_last = True
                else:
                    cls._froze_last = False
                gc.enable()

    @classmethod
    def _host_freezes(cls) -> bool:
        """Whether anything is frozen (ours are given back before this is asked): a host
        that uses gc.freeze() itself, remembered, so its frozen heap is counted once."""
        cls._host_froze = gc.get_freeze_count() > 0
        return cls._host_froze

    @classmethod
    def _thaw(cls) -> None:
        if cls._frozen:
            gc.unfreeze()
            cls._thawed += cls._frozen
            cls._frozen = 0
            if cls._thawed >= THAWED_FULL_PASS and gc.isenabled():
                cls._thawed = 0
                gc.collect()
