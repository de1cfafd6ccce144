"""Golden digest vectors of 0.1. These NEVER change below a major version: a different
digest for the same request would invalidate every in-flight run's replay and re-bill
users. If this test fails, the change that made it fail is a breaking change."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from toren.core.agent_api.context import _tool_spec
from toren.core.contract.digest import (
    HashCache,
    canonical_json,
    message_hash,
    message_list_node,
    model_digest,
    request_digest,
    tool_spec_hash,
)
from toren.errors import InvalidInput
from toren.providers.base import ModelRequest, ToolSpec

VECTORS = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "v0_1" / "digest_vectors.json").read_text("utf-8")
)


def _model_request(case: dict[str, Any]) -> ModelRequest:
    tools = tuple(ToolSpec(t["name"], t["description"], t["parameters"]) for t in case["tools"])
    return ModelRequest(
        case["provider"], case["model"], tuple(case["messages"]), tools, case["params"]
    )


def digest_of(case: dict[str, Any]) -> str:
    if case["kind"] == "model":
        return model_digest(_model_request(case))
    return request_digest(case["kind"], case["body"])


def test_there_are_enough_vectors() -> None:
    assert len(VECTORS["requests"]) >= 30


@pytest.mark.parametrize("vector", VECTORS["requests"], ids=lambda v: v["name"])
def test_request_digest_is_frozen(vector: dict[str, Any]) -> None:
    assert digest_of(vector["input"]) == vector["digest"]


@pytest.mark.parametrize("vector", VECTORS["messages"], ids=lambda v: v["input"]["role"])
def test_message_hash_is_frozen(vector: dict[str, Any]) -> None:
    assert message_hash(vector["input"]) == vector["hash"]


def test_tool_spec_hash_is_frozen() -> None:
    for vector in VECTORS["tools"]:
        assert tool_spec_hash(vector["input"]) == vector["hash"]


def _by_name(name: str) -> dict[str, Any]:
    return next(v for v in VECTORS["requests"] if v["name"] == name)


def test_key_order_does_not_matter() -> None:
    assert _by_name("model_key_order_a")["digest"] == _by_name("model_key_order_b")["digest"]


def test_transport_settings_never_enter_the_digest() -> None:
    assert (
        _by_name("model_transport_params_ignored")["digest"]
        == _by_name("model_params_float")["digest"]
    )


def test_int_and_float_are_distinct() -> None:
    digests = {
        _by_name(n)["digest"]
        for n in ("model_params_float_int_like", "model_params_int", "model_params_float")
    }
    assert len(digests) == 3


def test_each_vector_is_distinct() -> None:
    digests = [v["digest"] for v in VECTORS["requests"]]
    same = {
        ("model_key_order_a", "model_key_order_b"),
        ("model_params_float", "model_transport_params_ignored"),
    }
    dupes = {
        tuple(sorted((a["name"], b["name"])))
        for a in VECTORS["requests"]
        for b in VECTORS["requests"]
        if a["name"] < b["name"] and a["digest"] == b["digest"]
    }
    assert dupes == {tuple(sorted(p)) for p in same}
    assert len(set(digests)) == len(digests) - len(same)


def test_canonical_form() -> None:
    assert canonical_json({"b": 1, "a": [1.0, 0.1, "é", None, True]}) == (
        '{"a":[1.0,0.1,"é",null,true],"b":1}'.encode()
    )
    assert (
        canonical_json({"x": 1e100, "y": -0.0, "z": 2**70})
        == b'{"x":1e+100,"y":-0.0,"z":1180591620717411303424}'
    )


@pytest.mark.parametrize(
    "bad", [float("nan"), float("inf"), {1: "int key"}, {"s": {1, 2}}, b"bytes", object()]
)
def test_non_json_requests_are_refused(bad: Any) -> None:
    with pytest.raises(InvalidInput, match="cannot digest"):
        canonical_json({"v": bad})


def test_hash_cache_reuses_unchanged_messages_and_notices_mutation() -> None:
    cache = HashCache()
    history = [{"role": "user", "content": f"m{i}"} for i in range(50)]
    first = [cache.message(m) for m in history]
    assert first == [message_hash(m) for m in history]
    history[10]["content"] = "edited in place"
    history[20]["extra"] = {"k": [1, 2]}
    again = [cache.message(m) for m in history]
    assert again == [message_hash(m) for m in history]
    assert again[10] != first[10] and again[20] != first[20]
    history[20]["extra"]["k"].append(3)  # nested mutation
    assert cache.message(history[20]) == message_hash(history[20])
    history[30]["content"] = 1  # then True: equal in Python, different in JSON
    assert cache.message(history[30]) == message_hash(history[30])
    history[30]["content"] = True
    assert cache.message(history[30]) == message_hash(history[30])


def test_model_digest_with_cache_equals_without() -> None:
    case = _by_name("model_tool_call_turn")["input"]
    request = _model_request(case)
    cache = HashCache()
    assert model_digest(request, cache) == model_digest(request) == model_digest(request, cache)


def test_incremental_digest_equals_the_full_computation() -> None:
    from toren.providers.base import Message

    cache = HashCache()
    history: list[Any] = [Message(role="system", content="be brief")]
    tools = (ToolSpec("f", "d", {"type": "object", "properties": {}}),)
    for i in range(30):
        history.append(Message(role="user", content=f"q{i} é"))
        params = {"temperature": 0.5} if i % 3 else {}
        request = ModelRequest(
            "openai", "gpt-4o-mini", tuple(history), tools if i % 2 else (), params
        )
        assert cache.model(request).digest == model_digest(request)
        history.append({"role": "assistant", "content": f"a{i}"})
    # A request that is not an extension of the previous one (an edited earlier message).
    edited = [*history[:5], {"role": "user", "content": "edited"}, *history[6:]]
    request = ModelRequest("openai", "gpt-4o-mini", tuple(edited), (), {})
    assert cache.model(request).digest == model_digest(request)
    shorter = ModelRequest("openai", "gpt-4o-mini", tuple(history[:3]), (), {})
    assert cache.model(shorter).digest == model_digest(shorter)
    empty = ModelRequest("openai", "gpt-4o-mini", (), (), {})
    assert cache.model(empty).digest == model_digest(empty)


def test_immutable_messages_cannot_change_under_the_cache() -> None:
    from toren.providers.base import Message

    m = Message(role="user", content="x", tool_calls=[{"id": "1", "arguments": {"a": [1]}}])
    with pytest.raises(TypeError, match="immutable"):
        m["content"] = "y"  # type: ignore[index]
    with pytest.raises(TypeError):
        m.update(content="y")
    assert m["tool_calls"] == [{"id": "1", "arguments": {"a": [1]}}]
    with pytest.raises(TypeError):
        m["tool_calls"].append({})
    with pytest.raises(TypeError):
        m["tool_calls"][0]["arguments"]["a"].append(2)
    assert HashCache().message(m) == message_hash(dict(m))


def test_a_growing_conversation_reuses_its_prefix_only_where_it_may() -> None:
    """The hashes of a request's leading immutable Messages are reused when the next
    request starts with the very same objects; a plain dict anywhere in the history is
    re-hashed every time (it may have been edited in place), and so is all after it."""
    from toren.providers.base import Message

    cache = HashCache()
    history: list[Any] = [Message(role="system", content="s")]
    for i in range(40):
        history.append(Message(role="user", content=f"q{i}"))
        assert cache.messages(tuple(history)) == [message_hash(dict(m)) for m in history]
        history.append(Message(role="assistant", content=f"a{i}"))

    # A plain dict in the middle, edited in place between two calls.
    middle = {"role": "tool", "content": "before"}
    history.insert(20, middle)
    assert cache.messages(tuple(history)) == [message_hash(dict(m)) for m in history]
    middle["content"] = 1
    assert cache.messages(tuple(history)) == [message_hash(dict(m)) for m in history]
    middle["content"] = True  # equal to 1 in Python, a different message in JSON
    assert cache.messages(tuple(history)) == [message_hash(dict(m)) for m in history]

    # An earlier Message replaced by another object (same content, then other content).
    history[5] = Message(role="user", content="q2")
    assert cache.messages(tuple(history)) == [message_hash(dict(m)) for m in history]
    history[5] = Message(role="user", content="changed")
    assert cache.messages(tuple(history)) == [message_hash(dict(m)) for m in history]

    # Shorter than before, then an unrelated conversation, then empty.
    assert cache.messages(tuple(history[:3])) == [message_hash(dict(m)) for m in history[:3]]
    other = (Message(role="user", content="other"),)
    assert cache.messages(other) == [message_hash(dict(other[0]))]
    assert cache.messages(()) == []


def test_prefix_reuse_survives_a_caller_reusing_its_list() -> None:
    """A caller may pass a list and then replace its messages in place: new objects are
    hashed for what they are, never taken for the ones they replaced."""
    from toren.providers.base import Message

    cache = HashCache()
    history: list[Any] = [Message(role="user", content=f"m{i}") for i in range(5)]
    assert cache.messages(history) == [message_hash(dict(m)) for m in history]
    for i in range(1, 5):  # replaced in place; the old objects are gone from the list
        history[i] = Message(role="user", content=f"new {i}")
    assert cache.messages(history) == [message_hash(dict(m)) for m in history]


def test_cache_tells_a_dict_mutated_in_place_from_zero_to_negative_zero() -> None:
    """0.0 == -0.0 in Python, but their canonical forms differ ("0.0", "-0.0"): a dict
    mutated in place from one to the other must be hashed again, not served from cache."""
    cache = HashCache()
    message: dict[str, Any] = {"role": "tool", "content": "t", "score": 0.0}
    assert cache.message(message) == message_hash(dict(message))
    message["score"] = -0.0
    assert cache.message(message) == message_hash(dict(message))


# Message-list nodes are content addresses in the log (``ModelCallRecorded.message_list``)
# and keys of ``blobs``: their bytes are pinned like digests. Values computed by 0.1.
_H1 = "a23b46da8dbd7c3fffd55a9888516a12655182f167c222abc6c0c53c06e22690"
_H2 = "469c0b8b500d08dab06b7a140506402d9087f742cd01fc58c62fb95131c4fc83"
LIST_NODES = [
    (None, [], "f4d320dd32cbe2f5ae874d7a552d400315ae3f2e671ebd6f7f165e6198717fed"),
    (None, [_H1], "2a91548927b3f1b883aa71308613a4ddc7f156667d2435b377fe48c85474b785"),
    (None, [_H1, _H2], "7e7daf5488ce3e1ae1e1114898d339527da474e5dad004f67f149a590a3c3f39"),
    (_H1, [_H2], "e7a33f28afb19224000f83c84ea5ac24eb7d10388ce86dc749a7f2e35f804796"),
    (_H2, [], "cfad734dc84beb029c7842cb38da3e23f5c6ee6cbe3584138dceffc318ef2142"),
    # Not content addresses (never written by Toren, but the function is total).
    (
        'not-a-hash "quoted"',
        ["x y", "ü"],
        "1e73dbf6557b38ac579ed138db0b49794a6011f91989eb80d378c000544c5dec",
    ),
]


@pytest.mark.parametrize(("prev", "items", "expected"), LIST_NODES)
def test_message_list_node_golden(prev: str | None, items: list[str], expected: str) -> None:
    node, body = message_list_node(prev, items)
    assert node == expected
    # The body written directly for content addresses is the canonical form, byte for byte.
    assert body.encode("utf-8") == canonical_json({"prev": prev, "items": items})


# -- the rules of docs/digest.md, one vector each (appended in 0.2) ---------------------

# The sections 0.1 wrote, as parsed: never changed below a major (only appended to).
V0_1_SECTIONS_SHA256 = "43a9807e08f38e71de149a73ffed3236029eae9eb44ded4b9fd1a0a1205954c7"
RULES = VECTORS["rules"]


def test_the_0_1_vectors_are_unchanged() -> None:
    sections = {k: VECTORS[k] for k in ("version", "requests", "messages", "tools")}
    text = json.dumps(sections, sort_keys=True, ensure_ascii=False)
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == V0_1_SECTIONS_SHA256


def _rule_model_request(case: dict[str, Any]) -> ModelRequest:
    """As ``ctx.model`` builds it: tools given as mappings take the defaults."""
    tools = tuple(_tool_spec(t) for t in case["tools"])
    provider, _, model = case["reference"].partition(":")
    return ModelRequest(provider, model, tuple(case["messages"]), tools, case["params"])


def _rule_digest(vector: dict[str, Any]) -> tuple[bytes | None, str]:
    if "message" in vector:
        return canonical_json(vector["message"]), message_hash(vector["message"])
    if "tool" in vector:
        spec = _tool_spec(vector["tool"])
        return canonical_json(spec.to_dict()), tool_spec_hash(spec)
    case = vector["input"]
    if case["kind"] == "model":
        return None, model_digest(_rule_model_request(case))
    body = case["body"]
    return canonical_json({"kind": case["kind"], "body": body}), request_digest(case["kind"], body)


@pytest.mark.parametrize("vector", RULES, ids=lambda v: v["name"])
def test_rule_vector_is_frozen(vector: dict[str, Any]) -> None:
    assert vector["rule"] and vector["name"].startswith("rule_")
    if vector.get("refused"):
        with pytest.raises((InvalidInput, ValueError)):
            _rule_digest(vector)
        return
    canonical, digest = _rule_digest(vector)
    if canonical is not None:
        assert canonical.decode("utf-8") == vector["canonical"]
    assert digest == vector["digest"]


def test_the_rules_cover_every_step_kind_and_form() -> None:
    """At least one vector per step kind and per form the issue of the spec listed."""
    everything = [*VECTORS["requests"], *RULES]
    names = {v["name"] for v in everything}
    kinds = {v["input"]["kind"] for v in everything if "input" in v}
    assert kinds == {"model", "tool", "value", "sleep", "message", "child"}
    bodies = [v["input"].get("body") for v in everything if "input" in v]
    sleeps = {type(b["seconds"]) for b in bodies if b and set(b) == {"seconds"}}
    assert sleeps == {int, float}
    timeouts = {type(b["timeout"]) for b in bodies if b and set(b) == {"name", "timeout"}}
    assert timeouts == {type(None), int, float}
    for needed in (
        "rule_key_order_code_points_not_utf16",
        "rule_float_1e-07",
        "rule_float_negative_zero",
        "rule_int_beyond_64_bits",
        "rule_string_control_lowercase_hex",
        "rule_string_line_separator_not_escaped",
        "rule_string_non_bmp_raw",
        "rule_empty_containers",
        "rule_no_unicode_normalisation_decomposed",
        "rule_tool_spec_defaults",
        "rule_provider_is_the_reference_name",
        "rule_model_with_default_tool",
        "rule_model_without_tools",
        "rule_child_without_input",
    ):
        assert needed in names, needed
    # Each rule pins something of its own; the two spellings of "no parameters" are the
    # same spec on purpose (both take the default).
    same = {
        tuple(sorted((a["name"], b["name"])))
        for a in RULES
        for b in RULES
        if a["name"] < b["name"] and "digest" in a and a.get("digest") == b.get("digest")
    }
    assert same == {("rule_tool_spec_empty_parameters", "rule_tool_spec_null_parameters")}
