"""Golden digests of pydantic-ai requests (docs/digest.md, "pydantic-ai requests"). They
NEVER change below a major: a different digest for the same request would invalidate
every in-flight pydantic-ai run and re-bill it. CI checks them under two pydantic-ai
releases (test_pydantic_ai_releases.py): a pydantic-ai release that sends the same
request must keep the same digest."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from datetime import UTC

from pydantic_ai.messages import TextPart

from tests.integrations.pyai_vectors import cases, digests, forms
from toren.core.contract.digest import HashCache, model_digest
from toren.integrations.pydantic_ai import Conversions, neutral_request

VECTORS = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "pydantic_ai" / "digest_vectors.json").read_text()
)["requests"]


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_pydantic_ai_request_digest_is_frozen(name: str) -> None:
    assert digests()[name] == VECTORS[name]


def test_every_case_has_a_vector() -> None:
    assert sorted(cases()) == sorted(VECTORS)


def test_timestamps_and_transport_settings_stay_out_of_the_digest() -> None:
    from datetime import datetime

    messages, settings, params, model = cases()["tools-and-output-tool"]
    later = [
        type(m)(**{**m.__dict__, "timestamp": datetime(2030, 1, 1, tzinfo=UTC)})
        if hasattr(m, "timestamp") and type(m).__name__ == "ModelResponse"
        else m
        for m in messages
    ]
    quiet = {k: v for k, v in (settings or {}).items() if k != "timeout"}
    again = neutral_request(later, quiet, params, provider="openai", model=model)
    assert model_digest(again) == VECTORS["tools-and-output-tool"]


def test_the_neutral_form_is_what_the_docs_show() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "digest.md").read_text()
    shown = doc.split("<!-- pydantic-ai-form -->")[1].split("```json")[1].split("```")[0]
    assert json.loads(shown) == forms()["tools-and-output-tool"]
    for name, digest in VECTORS.items():
        assert f"| `{name}` | `{digest}` |" in doc


# -- one run's requests: each message converted once (Conversions) -------------------------


def _digest(messages: list[Any], memo: Any, case: str = "tools-and-output-tool") -> str:
    _, settings, params, model = cases()[case]
    request = neutral_request(messages, settings, params, provider="openai", model=model, memo=memo)
    return model_digest(request)


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_a_runs_conversions_give_every_vector_its_digest_again_and_again(name: str) -> None:
    messages, settings, params, model = cases()[name]
    provider = "anthropic" if model.startswith("claude") else "openai"
    memo, cache = Conversions(), HashCache()
    for _ in range(3):
        request = neutral_request(
            messages, settings, params, provider=provider, model=model, memo=memo
        )
        assert model_digest(request) == VECTORS[name]
        assert cache.model(request).digest == VECTORS[name]  # the engine's path


def test_a_growing_history_reuses_its_converted_messages() -> None:
    messages = cases()["tools-and-output-tool"][0]
    memo = Conversions()
    _, settings, params, model = cases()["tools-and-output-tool"]
    first = neutral_request(
        messages[:2], settings, params, provider="openai", model=model, memo=memo
    )
    second = neutral_request(messages, settings, params, provider="openai", model=model, memo=memo)
    # The same objects, so the digest cache knows them without a look at each.
    assert all(a is b for a, b in zip(first.messages, second.messages, strict=False))
    assert len(second.messages) == len(first.messages) + 1


def test_a_message_changed_in_place_is_converted_again() -> None:
    """Whatever a history processor (or pydantic-ai) changes in a message already sent,
    the next request's digest is the digest of what is sent now, never of what was."""
    messages = cases()["tools-and-output-tool"][0]
    asked, called, answered = messages
    memo = Conversions()
    changes: list[Callable[[], None]] = [
        lambda: setattr(asked.parts[0], "content", "Where is A-18?"),  # a field reassigned
        lambda: called.parts[1].args.__setitem__("order_id", "A-18"),  # a dict changed in place
        lambda: answered.parts[0].content.__setitem__("status", "lost"),  # a tool's result
        lambda: called.parts.append(TextPart(content="And more.")),  # a part added
        lambda: called.parts.__setitem__(0, TextPart(content="Looking.")),  # a part replaced
        lambda: setattr(called.parts[1], "args", {"order_id": 18}),  # str to int: other JSON
    ]
    seen = {_digest(messages, memo)}
    for change in changes:
        change()
        now = _digest(messages, memo)
        assert now == _digest(messages, None)  # what a fresh conversion gives
        assert now not in seen
        seen.add(now)


def test_a_part_holding_an_object_that_could_change_unseen_is_converted_every_time() -> None:
    from pydantic import BaseModel

    class Ticket(BaseModel):
        status: str

    messages = cases()["tools-and-output-tool"][0]
    ticket = Ticket(status="shipped")
    messages[2].parts[0].content = ticket  # a tool returned a pydantic model
    memo = Conversions()
    before = _digest(messages, memo)
    ticket.status = "lost"  # changed inside, no field of the part reassigned
    after = _digest(messages, memo)
    assert after == _digest(messages, None) != before


def test_a_field_holding_a_cycle_or_a_big_tree_is_not_walked_forever() -> None:
    """A field the model never sees (a tool result's ``metadata``) may hold anything: a
    dict that holds itself, or one reached by many paths. Such a message is converted
    every time (never pinned: that would walk it forever, or exponentially)."""
    messages = cases()["tools-and-output-tool"][0]
    looped: dict[str, Any] = {}
    looped["self"] = looped
    shared: list[Any] = [1]
    for _ in range(40):  # 2**40 paths to the innermost list, 41 containers
        shared = [shared, shared]
    memo = Conversions()
    for metadata in (looped, shared):
        messages[2].parts[0].metadata = metadata
        assert (
            _digest(messages, memo) == _digest(messages, None) == VECTORS["tools-and-output-tool"]
        )
        assert id(messages[2]) not in memo._kept
