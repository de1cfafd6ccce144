"""Whether a tick kept by the sticky cache (:mod:`toren.core.drivers.sticky`) may continue
in place under the run's next lease, or must replay: the one check, against the store."""

from __future__ import annotations

from toren.core.agent_api.program import AgentProgram
from toren.core.contract.records import Lease, RunRecord
from toren.core.contract.values import RunStatus
from toren.core.drivers.tickstate import TickState
from toren.errors import TorenError

__all__ = ["resumable"]


async def resumable(
    state: TickState, program: AgentProgram | None, lease: Lease
) -> RunRecord | None:
    """The run's row if the tick whose state is ``state`` (running ``program``), kept
    when the run parked, may continue under ``lease``: nothing can have changed since.
    Else None (the caller replays)."""
    kept = state.lease
    if (
        lease.recovered
        or lease.previous_status != RunStatus.WAITING
        or lease.worker_id != kept.worker_id
        or lease.epoch != kept.epoch + 1  # another claim came in between
    ):
        return None
    # What the claim read, when it did (Lease.record, Lease.last_seq): no round trip.
    run = lease.record or await state.store.get_run(lease.run_id)
    if run is None or run.cancel_requested:
        return None
    try:
        current = state.deps.agents.resolve(run.agent, run.process)
    except TorenError:
        return None
    if (
        current is not program
        or (state.deps.code_version or current.code_version) != state.code_version
    ):
        return None  # a new deploy (or a reload): its code replays the log
    after = state.journal.log.last_seq
    if lease.last_seq is not None:
        grew = lease.last_seq > after
    else:
        grew = bool(await state.store.load_events(lease.run_id, after_seq=after, limit=1))
    return None if grew else run  # a log that grew since this tick parked: replay it
