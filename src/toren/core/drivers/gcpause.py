"""The cycle collector paused while ticks replay (:class:`ReplayGcPause`)."""

from __future__ import annotations

import gc

__all__ = ["ReplayGcPause"]


class ReplayGcPause:
    """Pauses Python's cycle collector while ticks replay.

    A replay builds one object graph per recorded event (a 10,000-step run: ~50,000
    containers) and keeps it; the collector would re-scan that growing heap again and
    again while the agent code re-runs, a third of the replay's time. The objects are
    acyclic (reference counting frees them), so pausing the collector from the start of a
    tick until its first live step loses nothing. The collector is process-wide, hence one
    count shared by every tick of the process; it comes back on when no tick replays.
    """

    _replaying = 0
    _was_enabled = True

    @classmethod
    def begin(cls) -> None:
        if cls._replaying == 0:
            cls._was_enabled = gc.isenabled()
            gc.disable()
        cls._replaying += 1

    @classmethod
    def end(cls) -> None:
        cls._replaying -= 1
        if cls._replaying == 0 and cls._was_enabled:
            gc.enable()
