"""Strings that are not valid Unicode: the one rule for text entering the log.

A Python ``str`` can hold surrogate code points (U+D800 to U+DFFF) on their own, which no
UTF-8 text can: JSON carries them as ``"\\ud83d"`` escapes, and a provider that cuts a
stream in the middle of an emoji sends exactly that. Such a string cannot be stored, nor
hashed as UTF-8. The rule (docs/event-log.md, "Text that is not valid Unicode"):

* **Before anything runs or is paid** (a run's input, a message's payload), such a string is
  refused with :class:`~toren.errors.InvalidInput` naming where it is
  (:mod:`toren.core.contract.inputs`). The caller can fix it; nothing was stored.
* **After the fact** (a provider's answer, its streamed deltas and errors, a tool's result
  or error, an agent's output), it is **repaired**: the string is read as UTF-16, so a high
  surrogate followed by a low one becomes the character the pair encodes, and every other
  surrogate becomes U+FFFD (the replacement character). The repaired value is what is
  recorded and what the agent code sees, live and on replay alike. A paid call is never
  lost to a failed write.
* **Digests** hash a request's strings after the same repair (so a request holding
  ``"\\ud83d"`` has the digest of the same request holding ``"\\ufffd"``); a valid string is
  untouched, so no digest of a valid request changes.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogates(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def repair_text(text: str) -> str:
    """``text`` with surrogate pairs joined and lone surrogates replaced by U+FFFD."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def repair(value: Any) -> Any:
    """A JSON-like value with every string (keys too) repaired; the value itself when it
    holds no surrogate (the common case costs one orjson pass, no copy)."""
    try:
        orjson.dumps(value)
        return value
    except TypeError:  # a lone surrogate, or something orjson does not take: walk it
        pass
    return _repair(value)


def _repair(value: object) -> object:
    if isinstance(value, str):
        return repair_text(value)
    if isinstance(value, dict):
        return {(repair_text(k) if isinstance(k, str) else k): _repair(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_repair(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_repair(v) for v in value)
    return value
