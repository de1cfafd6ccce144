"""Reading recorded requests back: a model call's messages are stored by reference, as a
chain of message list nodes in ``blobs`` (see ``ModelCallRecorded``)."""

from __future__ import annotations

from toren.core.contract.ports import BlobStore
from toren.errors import CorruptEventLog


async def load_messages(store: BlobStore, node: str | None) -> list[object]:
    """The full message list a recorded model call sent, oldest first."""
    chain: list[list[str]] = []
    while node is not None:
        found = await store.get_blobs([node])
        if node not in found:
            raise CorruptEventLog(f"message list node {node!r} is missing from the blobs table")
        body = found[node]
        chain.append(list(body["items"]))
        node = body["prev"]
    hashes = [h for items in reversed(chain) for h in items]
    bodies = await store.get_blobs(sorted(set(hashes))) if hashes else {}
    missing = [h for h in hashes if h not in bodies]
    if missing:
        raise CorruptEventLog(f"message {missing[0]!r} is missing from the blobs table")
    return [bodies[h] for h in hashes]
