"""How records become statement parameters, for the modules of the store that insert
them (toren.store.sql, toren.store.firing): a leaf, so neither imports the other."""

from __future__ import annotations

from toren.core.contract.events import Event


def event_params(event: Event) -> tuple[object, ...]:
    """An event's values in the column order of ``INSERT_EVENT`` (toren.store.sql)."""
    return (
        event.run_id,
        event.stream,
        event.position,
        event.generation,
        event.slot,
        event.type,
        event.digest,
        event.code_version,
        event.worker_id,
        event.created_at,
        event.format_version,
        event.payload_json(),
        event.chain,
    )
