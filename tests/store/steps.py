"""Step events for the store tests: a recorded value at a position of the main stream."""

from __future__ import annotations

import time
from typing import Any

from toren.core.contract.events import Event, ValueRecorded, make_event
from toren.core.contract.replay import step_slot


def value_event(run_id: str, position: int, value: Any) -> Event:
    return make_event(
        run_id,
        ValueRecorded(what="random", value=value),
        stream="main",
        position=position,
        slot=step_slot("main", 0, position),
        digest=f"d{position}",
        created_at=time.time(),
    )
