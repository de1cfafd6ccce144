"""The HashCache reuses what it hashed only while it provably still holds: a growing
conversation of plain dicts is recognised as a whole (pinned, checked by identity), and any
change in place, however it is made, is hashed again. The reference is the digest computed
without a cache, which the golden vectors pin."""

from __future__ import annotations

import copy
import random
from typing import Any

from toren.core.contract.digest import HashCache, Pinned, message_hash, model_digest, tool_spec_hash
from toren.core.contract.model_types import FrozenList, Message, ModelRequest, ToolSpec


def _request(messages: list[Any], tools: tuple[ToolSpec, ...] = ()) -> ModelRequest:
    return ModelRequest("openai", "gpt-4o-mini", tuple(messages), tools, {})


def _check(cache: HashCache, messages: list[Any], tools: tuple[ToolSpec, ...] = ()) -> None:
    request = _request(messages, tools)
    assert cache.model(request).digest == model_digest(request)
    assert cache.messages(tuple(messages)) == [message_hash(dict(m)) for m in messages]


def test_a_conversation_of_plain_dicts_notices_every_change_in_place() -> None:
    cache = HashCache()
    system = {"role": "system", "content": "be brief"}
    history: list[Any] = [system, {"role": "user", "content": "q"}]
    for i in range(6):
        _check(cache, history)
        history.append(Message(role="assistant", content=f"a{i}"))
        history.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"r{i}"})
    _check(cache, history)

    tool = history[3]
    tool["content"] = "".join(["r", "0"])  # an equal string, another object
    _check(cache, history)
    for value in (1, True, 1.0, 0, False, -0.0, 0.0, None, "r0"):  # equal in Python, not JSON
        tool["content"] = value
        _check(cache, history)
    tool["text"] = tool.pop("content")  # the same value under another key
    _check(cache, history)
    tool["content"] = tool.pop("text")
    _check(cache, history)
    system["content"] = "be long"  # the first message, shared by every request
    _check(cache, history)
    history[1]["extra"] = {"k": [1, 2]}
    _check(cache, history)
    history[1]["extra"]["k"].append(3)  # nested, in a pinned container
    _check(cache, history)
    history[1]["extra"]["k"][0] = True
    _check(cache, history)
    history[1]["extra"]["j"] = history[1]["extra"].pop("k")
    _check(cache, history)
    history[5] = {"role": "tool", "tool_call_id": "c1", "content": "r1"}  # equal, replaced
    _check(cache, history)


def test_random_edits_always_give_the_reference_digest() -> None:
    rng = random.Random(24)
    values: list[Any] = ["x", "y", 1, 1.0, True, False, 0, None, [1], {"a": 1}, ["x", {"b": [2]}]]
    spec = ToolSpec("f", "d", {"type": "object", "properties": {"a": {"type": "string"}}})
    for _ in range(20):
        cache = HashCache()
        history: list[Any] = [{"role": "system", "content": "s"}]
        for _ in range(60):
            op = rng.randrange(6)
            dicts = [m for m in history if type(m) is dict]
            if op == 0:
                history.append({"role": "user", "content": rng.choice(["u", "v"])})
            elif op == 1:
                history.append(Message(role="assistant", content=rng.choice(["a", "b"])))
            elif op == 2 and dicts:
                value = copy.deepcopy(rng.choice(values))
                rng.choice(dicts)[rng.choice(["content", "role", "x"])] = value
            elif op == 3 and dicts:
                nested = [v for d in dicts for v in d.values() if isinstance(v, (dict, list))]
                if nested:
                    target = rng.choice(nested)
                    value = copy.deepcopy(rng.choice(values))
                    if isinstance(target, dict):
                        target[rng.choice("ab")] = value
                    else:
                        target.append(value)
            elif op == 4 and len(history) > 1:
                history.pop(rng.randrange(1, len(history)))
            elif op == 5:
                spec.parameters["properties"]["a"]["type"] = rng.choice(["string", "integer"])
            _check(cache, history, (spec,))


def test_tool_specs_changed_in_place_are_hashed_again() -> None:
    cache = HashCache()
    spec = ToolSpec("f", "d", {"type": "object", "properties": {"a": {"type": "string"}}})
    assert cache.tools((spec,)) == [tool_spec_hash(spec)]
    assert cache.tools((spec,)) == [tool_spec_hash(spec)]
    spec.parameters["properties"]["a"]["type"] = "integer"  # type: ignore[index]
    assert cache.tools((spec,)) == [tool_spec_hash(spec)]
    spec.parameters["required"] = ["a"]  # type: ignore[index]
    assert cache.tools((spec,)) == [tool_spec_hash(spec)]
    object.__setattr__(spec, "description", "another")  # around the frozen dataclass
    assert cache.tools((spec,)) == [tool_spec_hash(spec)]
    other = ToolSpec("g", "d")
    assert cache.tools((spec, other)) == [tool_spec_hash(spec), tool_spec_hash(other)]
    assert cache.tools(()) == []


def test_a_pin_holds_until_anything_in_it_changes() -> None:
    value: dict[str, Any] = {"a": "x", "b": [1, {"c": None}], "d": (2.5, "y")}
    pin = Pinned()
    assert pin.add(value) and pin.holds()
    value["a"] = "x"  # the same object again: still the same JSON
    assert pin.holds()
    value["b"][1]["c"] = 0
    assert not pin.holds()
    value["b"][1]["c"] = None
    assert pin.holds()
    value["b"].append(3)
    assert not pin.holds()

    assert Pinned().add(Message(role="user", content="immutable"))
    assert not Pinned().add({"a": object()})  # what is not JSON is never pinned
    assert not Pinned().add({1: "x"})
    assert not Pinned().add({"a": {"x"}})


def test_a_frozen_list_built_directly_is_looked_into() -> None:
    """A FrozenList refuses changes to its own items, but one built directly (not by a
    Message, which freezes what it holds) may hold a plain dict that changes."""
    cache = HashCache()
    inner = {"type": "text", "text": "hello"}
    first = {"role": "user", "content": FrozenList([inner])}
    history: list[Any] = [first]
    _check(cache, history)
    history.append({"role": "assistant", "content": "hi"})
    _check(cache, history)
    inner["text"] = "goodbye"
    history.append({"role": "user", "content": "again"})
    _check(cache, history)

    spec = ToolSpec("f", "d", {"type": "object", "anyOf": FrozenList([{"required": ["a"]}])})
    assert cache.tools((spec,)) == [tool_spec_hash(spec)]
    spec.parameters["anyOf"][0]["required"] = ["b"]  # type: ignore[index]
    assert cache.tools((spec,)) == [tool_spec_hash(spec)]


def test_single_message_requests_and_requests_without_tools_keep_the_reference() -> None:
    # One-message requests skip the prefix machinery; a conversation that starts with one
    # message and grows, a dict changed in place between two one-message requests, and
    # requests alternating with and without tools all give the uncached digest.
    cache = HashCache()
    spec = ToolSpec("lookup", "Look up.", {"type": "object", "properties": {}})
    first = {"role": "user", "content": "q"}
    _check(cache, [first])
    _check(cache, [first], (spec,))
    first["content"] = "changed"
    _check(cache, [first])
    _check(cache, [first], (spec,))
    history: list[Any] = [first]
    for i in range(4):
        history.append(Message(role="assistant", content=f"a{i}"))
        history.append({"role": "user", "content": f"u{i}"})
        _check(cache, history, (spec,) if i % 2 else ())
    spec.parameters["properties"] = {"id": {"type": "string"}}  # type: ignore[index]
    _check(cache, history, (spec,))
    _check(cache, [])
    for i in range(50):
        _check(cache, [{"role": "user", "content": f"fresh {i}"}])


def test_messages_rebuilt_for_every_request_hash_as_the_reference() -> None:
    # An adapter that converts a framework's history anew for every request passes new
    # dicts holding what earlier ones held: recognised by content, never confused with
    # values that are equal in Python but not in JSON.
    cache = HashCache()
    spec = {"name": "lookup", "description": "Look up.", "parameters": {"type": "object"}}
    history: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(5):
        history.append({"role": "user", "content": f"q{i}", "n": i})
        _check(cache, copy.deepcopy(history))
        request = ModelRequest("openai", "m", tuple(copy.deepcopy(history)), (dict(spec),), {})
        assert cache.model(request).digest == model_digest(request)
    for value in (1, True, 1.0, 0, False, -0.0, 0.0, None, "1", [1], {"a": 1}, (1,)):
        _check(cache, [{"role": "user", "content": "x", "n": value}])
    # A tool spec and a message holding the same JSON still hash as what each is.
    same = {"name": "a", "description": "b", "parameters": {}}
    assert cache.message(dict(same)) == message_hash(same)
    assert cache.tool(dict(same)) == tool_spec_hash(same)


def test_the_kept_bodies_are_bounded_and_calls_in_flight_keep_theirs() -> None:
    """A live step takes the canonical bodies of the request it hashed when its call
    returns; a replay hashes thousands of requests whose bodies nothing takes. The cache
    keeps a bounded number (each orjson result holds the buffer it grew, 4 KB and up),
    enough for calls in flight together (``ctx.gather``) to take their own; a body it no
    longer has is encoded again by the caller, to the same bytes."""
    from toren.core.contract.digest import _BODIES_KEPT, canonical_json

    cache = HashCache()
    first = {"role": "user", "content": "first"}
    for i in range(2_000):
        cache.model(ModelRequest("p", "m", [first, {"role": "user", "content": f"step {i}"}]))
    assert len(cache._bodies) <= _BODIES_KEPT
    together = [{"role": "user", "content": f"branch {i}"} for i in range(4)]
    hashed = [cache.model(ModelRequest("p", "m", [m])) for m in together]
    for message, request in zip(together, hashed, strict=True):  # each call returns
        assert cache.take_body(request.messages[0]) == canonical_json(message)
        assert cache.take_body(request.messages[0]) is None  # taken once
