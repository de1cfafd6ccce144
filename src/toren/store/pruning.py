"""The retention half of the journal port (:class:`toren.core.ports.JournalStore`): what a
worker's retention loop calls, for the dialect stores to inherit. The work is done by
:mod:`toren.store.retention`, imported on the first prune: a process that never prunes (a
CLI command, an API server) does not pay for loading it."""

from __future__ import annotations

from toren.core.ports import Store


class Pruning:
    async def prune_finished(self: Store, *, before: float, limit: int) -> int:
        """Prune one batch of up to ``limit`` runs finished before ``before``: the number
        of runs pruned (see :func:`toren.store.retention.prune_batch`)."""
        from toren.store.retention import prune_batch

        return (await prune_batch(self, before=before, limit=limit)).runs

    async def sweep_blobs(self: Store) -> int:
        """Delete the bodies nothing references any more (see
        :func:`toren.store.retention.sweep_blobs`)."""
        from toren.store.retention import sweep_blobs

        return await sweep_blobs(self)
