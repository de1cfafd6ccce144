"""A step consumes only a message of its own run.

The engine takes a message id from ``next_message(run_id, ...)``, so it always names a
message of the leased run; the store checks it anyway (defence in depth, as the lease
fence is): consuming another run's message fails the step instead of stealing it.
"""

from __future__ import annotations

import time

import pytest

from tests.store.steps import value_event
from tests.store.test_park_and_open import _new_run
from toren.errors import LeaseLost
from toren.store import Store


async def test_a_step_cannot_consume_another_runs_message(store: Store) -> None:
    mine, other = await _new_run(store), await _new_run(store)
    now = time.time()
    message_id = await store.send_message(other, "approval", {"ok": True}, now=now)
    (lease,) = await store.claim("w1", 1, now=now, ttl=60, only=mine)
    with pytest.raises(LeaseLost, match=str(message_id)):
        await store.append(lease, [value_event(mine, 0, 1)], consume_inbox=message_id, now=now + 1)
    written = [e.type for e in await store.load_events(mine)]
    assert written == ["RunStarted"]  # the step's event was rolled back with it
    left = await store.next_message(other, ["approval"])
    assert left is not None and left.id == message_id


async def test_a_step_consumes_its_own_runs_message_once(store: Store) -> None:
    run_id = await _new_run(store)
    now = time.time()
    message_id = await store.send_message(run_id, "approval", 1, now=now)
    (lease,) = await store.claim("w1", 1, now=now, ttl=60)
    await store.append(lease, [value_event(run_id, 0, 1)], consume_inbox=message_id, now=now + 1)
    assert await store.next_message(run_id, ["approval"]) is None
    with pytest.raises(LeaseLost):
        await store.append(
            lease, [value_event(run_id, 1, 2)], consume_inbox=message_id, now=now + 2
        )
