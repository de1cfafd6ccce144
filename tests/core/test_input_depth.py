"""One nesting limit for run inputs and message payloads (64 levels of objects and
arrays), one error: the host API here, on SQLite and PostgreSQL. The HTTP API and the CLI
test the same limit and words in tests/api/test_http.py and tests/cli/test_input_depth.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import toren
from toren.core.contract.inputs import (
    MAX_JSON_DEPTH,
    check_depth,
    format_path,
    json_data,
    text_depth,
)
from toren.errors import InvalidInput, RunNotFound
from toren.store import Store


def nested(depth: int) -> Any:
    """``depth`` levels of objects and arrays: [{"a": [{"a": ...}]}] (a list outermost
    when ``depth`` is odd)."""
    value: Any = "leaf"
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


def _waiter() -> toren.Registry:
    async def waits(ctx: toren.Context, input: Any) -> Any:
        return {"got": await ctx.wait_for_message("go")}

    registry = toren.Registry()
    registry.add("waits", waits)
    return registry


# -- the check itself ---------------------------------------------------------------------


def test_the_limit_is_64_levels_and_the_error_says_depth_place_and_limit() -> None:
    assert MAX_JSON_DEPTH == 64
    check_depth(nested(64), "run input", "input")
    check_depth({"a": [1]}, "run input", "input")
    with pytest.raises(InvalidInput) as info:
        check_depth({"ok": 1, "deep": nested(70)}, "run input", "input")
    assert info.value.message == (
        "run input nests objects and arrays 71 levels deep (level 65 at "
        "input.deep.a[0].a[0].a[0].a ... [0].a); expected at most 64 levels"
    )
    assert info.value.details == {"depth": 71, "limit": 64}


def test_the_place_is_the_first_too_deep_container_in_document_order() -> None:
    value = {"shallow": [1], "odd key": [nested(64)], "later": nested(80)}
    with pytest.raises(InvalidInput, match=r"81 levels deep \(level 65 at input\[\"odd key\"\]"):
        check_depth(value, "run input", "input")
    assert format_path("payload", ["a", 0, "b c", 2]) == 'payload.a[0]["b c"][2]'


def test_shared_and_tuple_containers_are_measured_and_a_cycle_is_left_to_json() -> None:
    shared = nested(40)
    check_depth([shared, shared, {"x": shared}], "run input", "input")  # 42 levels
    with pytest.raises(InvalidInput, match="65 levels deep"):
        check_depth((nested(64),), "run input", "input")
    cycle: list[Any] = []
    cycle.append(cycle)
    check_depth(cycle, "run input", "input")  # json_data then says "Circular reference"


@pytest.mark.parametrize(
    "value",
    [
        nested(3),
        nested(70),
        {"s": "[[[{{{", "t": 'quote " and \\ [', "deep": nested(66)},
        [1, [2, [3, {"k": []}]], "]]]"],
    ],
)
def test_text_too_deep_to_parse_is_measured_like_the_value(value: Any) -> None:
    heights_text = text_depth(json.dumps(value), MAX_JSON_DEPTH + 1)
    try:
        check_depth(value, "v", "input")
        expected: tuple[int, str] | None = None
    except InvalidInput as exc:
        expected = (exc.details["depth"], exc.message)
    if expected is None:
        assert heights_text[1] == []
    else:
        depth, message = expected
        assert heights_text[0] == depth
        assert format_path("input", heights_text[1]) in message


# -- the host API, on both backends ---------------------------------------------------------


async def test_start_run_refuses_a_too_deep_input_and_stores_nothing(store: Store) -> None:
    registry = _waiter()
    ok = await toren.start_run(store, registry, "waits", nested(64))
    assert json.dumps(ok.input) == json.dumps(nested(64))
    for depth in (65, 100, 5_000):  # 5000: deeper than Python's JSON parser goes
        with pytest.raises(InvalidInput) as info:
            await toren.start_run(store, registry, "waits", {"deep": nested(depth)})
        assert info.value.message.startswith(
            f"run input nests objects and arrays {depth + 1} levels deep (level 65 at input.deep"
        )
        assert info.value.message.endswith("); expected at most 64 levels")
    assert [r.id for r in await store.list_runs()] == [ok.id]


async def test_send_message_refuses_a_too_deep_payload_and_stores_nothing(store: Store) -> None:
    registry = _waiter()
    run = await toren.start_run(store, registry, "waits", None)
    deps = toren.TickDeps(store=store, agents=registry)
    assert (await toren.tick(run.id, deps)).status == "waiting"
    for depth in (65, 5_000):
        with pytest.raises(InvalidInput) as info:
            await toren.send_message(store, run.id, "go", nested(depth))
        assert info.value.message.startswith(
            f"message payload nests objects and arrays {depth} levels deep (level 65 at "
            f"payload{'[0].a' if depth % 2 else '.a[0]'}"
        )
    with pytest.raises(InvalidInput, match="must be JSON data"):
        await toren.send_message(store, run.id, "go", {"when": object()})
    assert await store.next_message(run.id, ["go"]) is None  # nothing was stored
    with pytest.raises(RunNotFound):
        await toren.send_message(store, "run_0000000000000000000000", "go", 1)

    assert await toren.send_message(store, run.id, "go", nested(64)) > 0
    result = await toren.tick(run.id, deps)
    assert result.status == "completed" and result.output == {"got": nested(64)}


# "go\n" and 255 characters plus "\n": re's "$" matches before a final newline, the
# HTTP API's (pydantic's) does not.
@pytest.mark.parametrize(
    "name", ["", "go\x00", "line\nbreak", "x" * 256, 7, "go\n", "x" * 255 + "\n"]
)
async def test_send_message_refuses_a_bad_name_and_stores_nothing(
    store: Store, name: object
) -> None:
    # The HTTP API's rule (a NUL would also fail on PostgreSQL as a driver error).
    registry = _waiter()
    run = await toren.start_run(store, registry, "waits", None)
    with pytest.raises(InvalidInput, match="is not valid; expected 1 to 255 characters"):
        await toren.send_message(store, run.id, name, 1)  # type: ignore[arg-type]
    assert await store.next_message(run.id, ["go"]) is None
    assert await toren.send_message(store, run.id, "x" * 255, 1) > 0


def test_a_value_that_contains_itself_deep_down_is_invalid_input() -> None:
    # json.dumps recurses past Python's limit before it reaches the cycle and can name it:
    # the host API must still answer InvalidInput, not RecursionError.
    root: list[Any] = []
    node = root
    for _ in range(5_000):
        child: list[Any] = []
        node.append(child)
        node = child
    node.append(root)

    with pytest.raises(InvalidInput, match="contains itself"):
        json_data(root, "run input", "input")
