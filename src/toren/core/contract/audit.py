"""What ``toren runs verify`` checks beyond request digests: a digest of each recorded
response with its usage, and a hash chain over a run's events (``docs/digest.md`` §6
and §7 are normative; ``tests/core/test_audit_golden.py`` pins the vectors).

* **Response digest** (``response_digest`` in a ``ModelCallRecorded`` or
  ``ToolCallRecorded`` payload): sha256 over ``toren.response.v1\\n`` and the canonical
  JSON (``docs/digest.md`` §2) of what the step answered and what it cost: for a model
  call its response, error, token counts and cost; for a tool call its result and error.
  A tampered answer, token count or cost no longer hashes to it.
* **Chain** (the ``chain`` column of every event): sha256 over ``toren.chain.v1\\n``, the
  canonical JSON of an array holding the ``chain`` of the run's previous event (in seq
  order; null for the first, or when the previous event was written by an earlier
  version) and this event's envelope, a newline, then the payload exactly as stored.
  Each event so commits to the whole log before it: an event deleted, moved or altered
  breaks the link of the event after it (or its own).

Both are additive: events written before 0.2 have neither, and their readers ignore them.
Where the chain is computed (one writer per run at a time) is explained in
``docs/event-log.md#the-chain``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import orjson

from toren.core.contract.digest import canonical_json
from toren.core.contract.events import Event, Payload

RESPONSE_PREFIX = b"toren.response.v1\n"
CHAIN_PREFIX = b"toren.chain.v1\n"

P = TypeVar("P", bound=Payload)

# The payload fields a response digest covers, per event type (in this order in the spec;
# the canonical form sorts them).
RESPONSE_FIELDS: Mapping[str, tuple[str, ...]] = {
    "ModelCallRecorded": ("response", "error", "input_tokens", "output_tokens", "cost_usd"),
    "ToolCallRecorded": ("result", "error"),
}


def response_body(event_type: str, fields: Mapping[str, object]) -> dict[str, object]:
    """The value a response digest covers: the type and the covered fields of a payload."""
    body: dict[str, object] = {"type": event_type}
    for name in RESPONSE_FIELDS[event_type]:
        body[name] = fields.get(name)
    return body


def response_digest(event_type: str, fields: Mapping[str, object]) -> str:
    """The response digest of a payload's fields (a payload's ``__dict__``, or the JSON
    object read back from the log)."""
    h = hashlib.sha256(RESPONSE_PREFIX)
    h.update(canonical_json(response_body(event_type, fields)))
    return h.hexdigest()


def with_response_digest(payload: P) -> P:
    """``payload`` (a new ModelCallRecorded or ToolCallRecorded) carrying its digest. Set
    in place: the payload is new and not yet shared (a frozen dataclass's field is written
    through ``__dict__``, as ``Payload.from_dict`` builds them)."""
    payload.__dict__["response_digest"] = response_digest(payload.TYPE, payload.__dict__)
    return payload


def envelope(prev: str | None, event: Event) -> list[object]:
    """The array the chain hashes before the payload (``docs/digest.md`` §7). The one
    float comes last, so the common case is encoded fast (:func:`_envelope_bytes`)."""
    return [
        prev,
        event.run_id,
        event.stream,
        event.position,
        event.generation,
        event.slot,
        event.type,
        event.digest,
        event.code_version,
        event.worker_id,
        event.format_version,
        float(event.created_at),
    ]


def _envelope_bytes(items: list[Any]) -> bytes:
    """``canonical_json(items)``, by orjson for all but the last item, a float, written as
    the reference encoder writes it (``float.__repr__``): the reference encoder, which a
    list with a float takes, costs more than the rest of the chain. Anything orjson does not
    write as the reference encoder would (a lone surrogate, a huge integer: a TypeError)
    takes ``canonical_json``."""
    *head, created_at = items
    try:
        text = orjson.dumps(head)
    except TypeError:
        return canonical_json(items)
    if not math.isfinite(created_at):
        return canonical_json(items)  # refused there, as any non-finite number
    return text[:-1] + b"," + float.__repr__(created_at).encode("ascii") + b"]"


def chain_hash(prev: str | None, event: Event, payload_text: str) -> str:
    """The ``chain`` of ``event`` written after an event whose chain is ``prev``, its
    payload stored as ``payload_text``."""
    h = hashlib.sha256(CHAIN_PREFIX)
    h.update(_envelope_bytes(envelope(prev, event)))
    h.update(b"\n")
    h.update(payload_text.encode("utf-8"))
    return h.hexdigest()


def chain(prev: str | None, events: Sequence[Event]) -> str | None:
    """Set the ``chain`` of each of ``events`` (new, not yet stored, in the order they are
    to be stored) after an event whose chain is ``prev``; the last chain. The payload's
    text is computed once here and kept on the event for the store's insert."""
    for event in events:
        values = event.__dict__
        text = values.get("_payload_text")
        if text is None:
            text = values["_payload_text"] = event.payload_json()
        prev = values["chain"] = chain_hash(prev, event, text)
    return prev


def tail(events: Sequence[Event]) -> str | None:
    """The chain a new event of a run whose log is ``events`` follows."""
    return events[-1].chain if events else None
