"""The redactor on its own: what it scrubs, and that no value can make it fail."""

from __future__ import annotations

from typing import Any

from toren.redact import MAX_DEPTH, TOO_DEEP, Redactor

from .support import SECRET


def test_scrubs_strings_and_keys_and_keeps_the_rest() -> None:
    value = {"b": [f"key {SECRET}", 1, 2.5, None, True], SECRET: {"plain-secret-1": "x"}, "a": 0}
    out = Redactor(["plain-secret-1"])(value)
    assert out == {
        "b": ["key [redacted]", 1, 2.5, None, True],
        "[redacted]": {"[redacted]": "x"},
        "a": 0,
    }
    assert list(out) == ["b", "[redacted]", "a"]  # key order kept
    assert value[SECRET] == {"plain-secret-1": "x"}  # a copy: the input is untouched


def test_any_depth_is_handled_and_cut_at_the_bound() -> None:
    value: Any = "leaf"
    for _ in range(100_000):  # far past Python's recursion limit
        value = [value]
    out = Redactor()(value)
    depth = 0
    while isinstance(out, list):
        out, depth = out[0], depth + 1
    assert (depth, out) == (MAX_DEPTH, TOO_DEEP)
