"""JSON text for the log: one fast path (orjson) where its bytes are provably the same as
the standard library's, and the standard library everywhere else.

``plain_kind`` walks a value once, without recursion, and says whether it holds only the
common JSON types (``str``, ``int``, ``bool``, ``None``, finite ``float``, ``dict``,
``list``, ``tuple`` and Toren's immutable :class:`Message`/:class:`FrozenList`). Only such
values take orjson: floats that are not finite (which ``json`` writes as ``NaN`` and orjson
would silently turn into ``null``), other Mappings, and every other type keep the exact
behaviour of :mod:`json`, errors included.

``loads`` reads stored JSON text with orjson where its result is provably the one
:func:`json.loads` gives, and with :mod:`json` everywhere else (see its docstring).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from toren.core.contract.model_types import FrozenList, Message
from toren.core.contract.text import has_surrogates, repair_text

NOT_PLAIN, PLAIN, PLAIN_WITH_FLOATS = 0, 1, 2
_MAX_NODES = 100_000  # containers walked at most before leaving a value to json

# Types orjson would serialise where ``json`` raises: keep them on the ``json`` path.
_STRICT = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def plain_kind(value: Any) -> int:
    """``PLAIN``, ``PLAIN_WITH_FLOATS`` (finite floats somewhere) or ``NOT_PLAIN``."""
    kind = PLAIN
    stack = [value]
    pop, push = stack.pop, stack.append
    budget = _MAX_NODES
    while stack:
        budget -= 1
        if budget < 0:  # very large, or cyclic: json decides (and names a cycle)
            return NOT_PLAIN
        v = pop()
        t = type(v)
        if t is str or t is int or t is bool or v is None:
            continue
        if t is float:
            if v - v != 0:  # NaN and infinities
                return NOT_PLAIN
            kind = PLAIN_WITH_FLOATS
            continue
        if t is dict or t is Message:
            for k, item in v.items():
                if type(k) is not str:
                    return NOT_PLAIN
                ti = type(item)
                if ti is not str and ti is not int and item is not None and ti is not bool:
                    push(item)
            continue
        if t is list or t is tuple or t is FrozenList:
            stack.extend(v)
            continue
        return NOT_PLAIN
    return kind


def dumps(value: object) -> str:
    """Compact JSON text (``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``
    in meaning; float spelling may differ, e.g. ``1e+16`` vs ``1e16``). For stored
    payloads, never for digests (see :func:`toren.core.contract.digest.canonical_json`)."""
    if plain_kind(value) != NOT_PLAIN:
        try:
            return orjson.dumps(value, option=_STRICT).decode("utf-8")
        except TypeError:  # an integer beyond 64 bits, or a lone surrogate
            pass
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    # Stored text is UTF-8: a string that is not valid Unicode is stored repaired
    # (toren.core.contract.text) rather than failing the write. Values from outside are repaired
    # before they are recorded, so this only catches what slipped past (a request's params).
    return repair_text(text) if has_surrogates(text) else text


# Every byte a digit maps to b"1", every other byte to b"0": an integer literal orjson
# could read inexactly has 19 digits or more in a row (see loads).
_DIGIT_MAP = bytes(0x31 if 0x30 <= b <= 0x39 else 0x30 for b in range(256))
_LONG_DIGITS = b"1" * 19
# orjson reads an integer outside 64 bits as a float of at least this magnitude.
_HUGE = 2.0**63
# Below this many characters, the digit scan costs less than walking the value.
_SCAN_BELOW = 512


def loads(text: str) -> Any:
    """``json.loads(text)``, the same value, faster for the log's payloads.

    orjson reads the same JSON to the same value with three exceptions, all left to
    :mod:`json`: an integer outside 64 bits (orjson makes it a float), a literal ``json``
    accepts and orjson refuses (``NaN``, ``Infinity``, ``1e400``), and a string holding
    lone surrogates (``"\\ud800"``, which orjson refuses). Invalid JSON raises ``json``'s
    error, as before.

    The first is found one of two ways, whichever costs less for the text: a short text
    is scanned for 19 or more digits in a row (inside strings too) before orjson reads
    it; a longer one is read first and its value walked for a float of magnitude 2**63
    or more (every integer outside 64 bits becomes one), the walk giving up for the scan
    once it has met more items than one per 64 characters: a log's payloads are mostly
    text (a model's answer), whose bytes the scan would read one by one. A float that
    large found in a text without such a run of digits was written as a float: orjson's
    value stands."""
    if type(text) is not str:
        return json.loads(text)
    if len(text) < _SCAN_BELOW:  # the scan, written out: the common short payload
        raw = text.encode("utf-8", "surrogatepass")
        if _LONG_DIGITS not in raw.translate(_DIGIT_MAP):
            try:
                return orjson.loads(raw)
            except orjson.JSONDecodeError:
                pass
        return json.loads(text)
    # orjson given a str keeps a UTF-8 copy of it on the str when it is not ASCII; given
    # bytes, it keeps nothing (and a lone surrogate is invalid UTF-8 either way).
    data = text if text.isascii() else text.encode("utf-8", "surrogatepass")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(text)
    if _huge_float(value, len(text) >> 6) is not False and _long_digits(text):
        return json.loads(text)
    return value


def _long_digits(text: str) -> bool:
    """Whether ``text`` holds 19 or more ASCII digits in a row."""
    return _LONG_DIGITS in text.encode("utf-8", "surrogatepass").translate(_DIGIT_MAP)


def _huge_float(value: Any, budget: int) -> bool | None:
    """Whether ``value`` (as orjson reads JSON: dicts, lists, scalars) holds a float of
    magnitude 2**63 or more; None once more than ``budget`` items were met."""
    t = type(value)
    if t is not dict and t is not list:
        return t is float and (value >= _HUGE or value <= -_HUGE)
    stack = [value]
    while stack:
        v = stack.pop()
        items = v.values() if type(v) is dict else v
        budget -= len(items)
        if budget < 0:
            return None
        for x in items:
            t = type(x)
            if t is float:
                if x >= _HUGE or x <= -_HUGE:
                    return True
            elif t is dict or t is list:
                stack.append(x)
    return False
