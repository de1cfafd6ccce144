"""The fast JSON paths against the reference encoder.

``canonical_json`` sends plain, float-free values through orjson; its bytes must be the
reference encoder's byte for byte, or digests would change (the golden vectors pin the
common cases; these tests sweep every code point and random documents). ``dumps`` (stored
payloads) must round-trip to the same value as ``json.dumps`` and keep ``json``'s
behaviour for what orjson would treat differently (NaN, big integers, other types).
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toren.core.contract import jsontext
from toren.core.contract.digest import canonical_json, reference_canonical_json
from toren.core.contract.jsontext import (
    NOT_PLAIN,
    PLAIN,
    PLAIN_WITH_FLOATS,
    dumps,
    loads,
    plain_kind,
)
from toren.providers.base import Message

_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_documents = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.tuples(inner, inner),
        st.dictionaries(_text, inner, max_size=5),
    ),
    max_leaves=30,
)


def test_every_code_point_is_spelled_as_the_reference_spells_it() -> None:
    chunk = 4096
    for start in range(0, 0x110000, chunk):
        chars = [
            chr(cp)
            for cp in range(start, min(start + chunk, 0x110000))
            if not 0xD800 <= cp <= 0xDFFF
        ]
        # One document per block: a list of one-character strings and an object keyed by them.
        doc = {"list": chars, "keys": {c: i for i, c in enumerate(chars)}}
        assert plain_kind(doc) == PLAIN
        assert canonical_json(doc) == reference_canonical_json(doc), hex(start)


@settings(max_examples=400, deadline=None)
@given(_documents)
def test_canonical_json_equals_the_reference(doc: Any) -> None:
    assert canonical_json(doc) == reference_canonical_json(doc)
    assert canonical_json(Message({"role": "user", "content": doc})) == reference_canonical_json(
        {"role": "user", "content": doc}
    )


@settings(max_examples=400, deadline=None)
@given(_documents)
def test_stored_text_reads_back_as_the_same_value(doc: Any) -> None:
    back = json.loads(dumps(doc))
    assert back == json.loads(json.dumps(doc, ensure_ascii=False))
    # 1 and 1.0 stay apart (equal in Python, different in JSON and in replay).
    assert _types(back) == _types(json.loads(json.dumps(doc)))


def _types(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


def test_plain_kind() -> None:
    assert plain_kind({"a": [1, "x", None, True, (2,)]}) == PLAIN
    assert plain_kind({"a": [1, 2.5]}) == PLAIN_WITH_FLOATS
    for bad in (float("nan"), float("inf"), {1: "x"}, {1, 2}, b"x", object()):
        assert plain_kind({"a": [bad]}) == NOT_PLAIN


def test_what_orjson_would_change_keeps_the_reference_behaviour() -> None:
    # NaN stays NaN (orjson would write null), big integers stay exact.
    assert dumps({"x": float("nan")}) == '{"x":NaN}'
    assert math.isnan(json.loads(dumps({"x": float("nan")}))["x"])
    assert json.loads(dumps({"n": 2**80})) == {"n": 2**80}
    assert canonical_json({"n": 2**80}) == b'{"n":1208925819614629174706176}'
    # Types json refuses are still refused (orjson would serialise them).
    import dataclasses
    import datetime

    @dataclasses.dataclass
    class D:
        x: int

    for value in (D(1), datetime.datetime(2026, 1, 1), {"s": {1}}):
        with pytest.raises(TypeError):
            dumps(value)
    # A lone surrogate cannot be stored as it is: it is stored repaired (toren.core.contract.text),
    # never a failed write.
    assert dumps(["\ud800", "\ud83d\ude00"]) == '["\ufffd","\U0001f600"]'


def test_a_cyclic_value_is_refused_not_walked_forever() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(ValueError, match="Circular"):
        dumps(cyclic)


@settings(max_examples=400, deadline=None)
@given(_documents)
def test_loads_reads_what_json_reads(doc: Any) -> None:
    for text in (dumps(doc), json.dumps(doc), json.dumps(doc, ensure_ascii=False, indent=1)):
        assert _same(loads(text), json.loads(text)), text


@pytest.mark.parametrize(
    "text",
    [
        "18446744073709551616",  # orjson would read a float
        "-9223372036854775809",
        '{"n": 123456789012345678901234567890}',
        "[1e400, -1e400]",  # json: infinities; orjson refuses
        "NaN",
        '{"x": Infinity}',
        '"\\ud800"',  # a lone surrogate, escaped
        '"\ud800"',  # ... and literal
        '{"a": 1, "a": 2}',
        "0.1000000000000000055511151231257827",
        "-0",
        "-0.0",
        "5e-324",
    ],
)
def test_loads_edge_cases_match_json(text: str) -> None:
    assert _same(loads(text), json.loads(text))


_EDGE_VALUES = [
    "18446744073709551616",
    "18446744073709551615",  # the largest integer orjson reads exactly
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "-9223372036854775808",
    "123456789012345678901234567890",
    "1e19",  # a float that large, read by json (the same value)
    "1e400",
    '"1234567890123456789012345"',  # digits in a string: no integer
    "0.5",
]


@pytest.mark.parametrize("value", _EDGE_VALUES)
def test_long_texts_match_json_whichever_way_loads_checks_them(value: str) -> None:
    """A long text is read first and its value walked; one too dense to walk cheaply is
    scanned for long digit runs instead. Both ways give json's value."""
    sparse = f'{{"answer": "{"x" * 700}", "v": [{value}]}}'
    dense = f'{{"many": [{",".join(["1"] * 700)}, {value}]}}'
    scalar = " " * 600 + value
    for text, walked in ((sparse, True), (dense, False), (scalar, True)):
        assert len(text) >= jsontext._SCAN_BELOW
        assert _same(loads(text), json.loads(text)), text
        try:
            value_read = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue  # json's way at once
        outcome = jsontext._huge_float(value_read, len(text) >> 6)
        assert (outcome is not None) is walked, (text[:40], outcome)


@pytest.mark.parametrize("text", ["", "{", "[1,]", '{"a" 1}', "\ufeff{}", '"x" y', "nul"])
def test_loads_refuses_what_json_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        loads(text)


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: the same types (1, 1.0 and True apart), NaN equal to NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and str(a) == str(b))
    return bool(a == b)
