"""List pages and event pages rendered straight to JSON bytes, and their HTTP validators.

``GET /v1/runs`` is what consoles poll, so its cost per page decides how many clients
one server process can serve. Its body is the same as the ``RunList`` model would
serialise (same keys, same order, same values: ``tests/api/test_list_render.py`` compares
them byte for byte), but built with one ``orjson.dumps`` per run instead of validating
and serialising fifty pydantic models, and checked for secrets and depth on the
serialised text in one pass instead of value by value. A page the fast path cannot
vouch for (a possible secret, a value nested too deep, a value orjson cannot encode)
returns ``None`` and the caller takes the general path.

A run's page of events (``GET /v1/runs/{id}/events``) is rendered the same way, event by
event (``event_fragment``): the bytes the ``Event`` model serialises, built with one
``orjson`` round trip of the stored payload instead of a validation and a serialisation
per event; an event the fast path cannot vouch for goes the general way alone.

The body's ETag is a hash of the body itself, so it is right whatever changed (a row,
the redaction rules, the code) and needs no bookkeeping; a client that sends it back in
``If-None-Match`` gets ``304 Not Modified`` without the body.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import orjson

from toren.api import models
from toren.core.contract.events import Event
from toren.redact import MAX_DEPTH, Redactor
from toren.store.base import RunRecord

# The order pydantic serialises a Run in (its fields, in declaration order). Keys of
# ``RunRecord.to_dict`` that the model does not have are dropped, as pydantic drops them.
RUN_FIELDS = tuple(models.Run.model_fields)
_SUMMARY_KEYS = ("input_summary", "output_summary", "error_summary")
assert RUN_FIELDS[-3:] == _SUMMARY_KEYS


class Fragments:
    """The rendered JSON of recently listed records, by record: the store hands out the
    same record for an unchanged row (``toren.store.sql.ListedRows``), so a page polled
    again is mostly joined, not rendered. A record is immutable and its fragment depends
    on nothing else; the entry keeps the record alive, so its ``id`` is not reused."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._found: dict[int, tuple[RunRecord, bytes]] = {}

    def get(self, run: RunRecord) -> bytes:
        entry = self._found.get(id(run))
        if entry is not None and entry[0] is run:
            return entry[1]
        fragment = run_fragment(run)
        if len(self._found) >= self.size:
            del self._found[next(iter(self._found))]  # the oldest first
        self._found[id(run)] = (run, fragment)
        return fragment


_FRAGMENTS = Fragments()  # used from the event loop's thread only


def run_fragment(run: RunRecord) -> bytes:
    """One run in the ``Run`` model's shape and key order, as compact JSON bytes."""
    values = run.to_dict()
    for key in _SUMMARY_KEYS:  # absent when not set; last, in this order, in the model
        values[key] = values.pop(key, None)
    if tuple(values) != RUN_FIELDS:  # the record gained a field the model lacks, say
        values = {key: values.get(key) for key in RUN_FIELDS}
    # Copied to a bytes of its own size: orjson's result keeps the buffer it grew (8 KB
    # and up for a 1 KB run), and these are kept, by ``Fragments`` and by the pages of
    # ``Pages`` (50 concurrent searches held ~35 MB of such slack in a server).
    return memoryview(orjson.dumps(values)).tobytes()


def runs_page(
    runs: Sequence[RunRecord], next_cursor: str | None, redactor: Redactor
) -> bytes | None:
    """The JSON body of a ``RunList``, or None when the general path must render it (a
    value to redact, one nested too deep for the redactor to pass as it is, one orjson
    cannot encode: an integer beyond 64 bits, say)."""
    try:
        fragments = [_FRAGMENTS.get(run) for run in runs]
    except (TypeError, orjson.JSONEncodeError):
        return None
    return _join(fragments, next_cursor, redactor)


class Pages:
    """The pages rendered lately (body and ETag), by the fragments they joined: the same
    fragments (the same records, so the same rows) make the same page, which is then
    neither joined, searched for secrets nor hashed again. One per app, since what passes
    depends on its redactor. Bounded by the bytes of the bodies it keeps."""

    def __init__(self, max_bytes: int = 8 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._bytes = 0
        self._found: dict[tuple[object, ...], tuple[list[bytes], bytes, str]] = {}

    def page(
        self, runs: Sequence[RunRecord], next_cursor: str | None, redactor: Redactor
    ) -> tuple[bytes, str] | None:
        """``runs_page`` and its ``etag``, or None (see ``runs_page``)."""
        try:
            fragments = [_FRAGMENTS.get(run) for run in runs]
        except (TypeError, orjson.JSONEncodeError):
            return None
        # The entry keeps its fragments alive, so their ids stand for them.
        key = (next_cursor, *map(id, fragments))
        found = self._found.get(key)
        if found is not None:
            return found[1], found[2]
        body = _join(fragments, next_cursor, redactor)
        if body is None:
            return None
        tag = etag(body)
        if len(body) <= self.max_bytes // 4:
            while self._found and self._bytes + len(body) > self.max_bytes:
                oldest = next(iter(self._found))
                self._bytes -= len(self._found.pop(oldest)[1])
            self._found[key] = (fragments, body, tag)
            self._bytes += len(body)
        return body, tag


def _join(fragments: list[bytes], next_cursor: str | None, redactor: Redactor) -> bytes | None:
    for fragment in fragments:
        # The redactor passes a run unchanged when its JSON text has at most MAX_DEPTH
        # brackets (so no deeper nesting); more may still be fine, but that is its call.
        if fragment.count(b"[") + fragment.count(b"{") > MAX_DEPTH:
            return None
    body = b'{"runs":[' + b",".join(fragments) + b'],"next_cursor":'
    body += orjson.dumps(next_cursor) + b"}"
    return body if redactor.passes_json_text(body.decode()) else None


# The ``Event`` model's fields in its order, and the Python types each may hold for the
# model to serialise it unchanged (pydantic would coerce anything else: an int
# ``created_at`` serialises as a float, say; such an event takes the general path).
_EVENT_TYPES: dict[str, tuple[type, ...]] = {
    "seq": (int,),
    "run_id": (str,),
    "type": (str,),
    "stream": (str,),
    "position": (int, type(None)),
    "generation": (int,),
    "slot": (str, type(None)),
    "digest": (str, type(None)),
    "code_version": (str,),
    "worker_id": (str,),
    "created_at": (float,),
    "format_version": (int,),
    "chain": (str, type(None)),
}
assert (*_EVENT_TYPES, "payload") == tuple(models.Event.model_fields)


# 19 digits in a row, anywhere (strings too: a cheap, conservative test): an integer that
# may not fit 64 bits, which orjson.loads would turn into a float.
_LONG_NUMBER = re.compile(r"\d{19}")


def event_fragment(event: Event, redactor: Redactor) -> bytes | None:
    """One event as the ``Event`` model serialises it (same keys, order and bytes: compact
    JSON), or None when the general path must render it: a value to redact, nesting too
    deep for the redactor to pass as it is, a payload orjson cannot read or write (an
    integer beyond 64 bits, ``NaN``, a lone surrogate), a field of another type."""
    values: dict[str, object] = {}
    for name, types in _EVENT_TYPES.items():
        value = getattr(event, name)
        if type(value) not in types:  # exact types: a bool is not an int here
            return None
        values[name] = value
    text = event.payload_json()
    if _LONG_NUMBER.search(text):  # orjson reads an integer beyond 64 bits as a float
        return None
    try:
        payload = orjson.loads(text)
        if type(payload) is not dict:
            return None
        values["payload"] = payload
        fragment = orjson.dumps(values)
    except (TypeError, ValueError):  # orjson's decode and encode errors are ValueErrors
        return None
    # As for a run: at most MAX_DEPTH brackets in the text, so no deeper nesting.
    if fragment.count(b"[") + fragment.count(b"{") > MAX_DEPTH:
        return None
    return fragment if redactor.passes_json_text(fragment.decode()) else None


def etag(body: bytes) -> str:
    """A strong validator of ``body``: equal bodies, equal tags."""
    return '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'


_TAG = re.compile(r'\s*(?:W/)?("[^"]*"|\*)\s*(?:,|$)')


def not_modified(if_none_match: str | None, tag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``tag`` (weak comparison, RFC 9110
    13.1.2: ``W/`` prefixes are ignored), or is ``*``."""
    if not if_none_match:
        return False
    return any(match.group(1) in (tag, "*") for match in _TAG.finditer(if_none_match))


__all__ = [
    "RUN_FIELDS",
    "Fragments",
    "Pages",
    "etag",
    "event_fragment",
    "not_modified",
    "run_fragment",
    "runs_page",
]
