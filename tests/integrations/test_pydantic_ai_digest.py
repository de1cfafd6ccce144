"""Golden digests of pydantic-ai requests (docs/digest.md, "pydantic-ai requests"). They
NEVER change below a major: a different digest for the same request would invalidate
every in-flight pydantic-ai run and re-bill it. CI checks them under two pydantic-ai
releases (test_pydantic_ai_releases.py): a pydantic-ai release that sends the same
request must keep the same digest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from datetime import UTC

from tests.integrations.pyai_vectors import cases, digests, forms
from toren.core.contract.digest import model_digest
from toren.integrations.pydantic_ai import neutral_request

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
