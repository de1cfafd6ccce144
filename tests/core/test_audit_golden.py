"""Golden vectors of the response digest and the event chain (docs/digest.md §6, §7).

Each vector is checked twice: against Toren's implementation (``toren.core.contract.audit``) and
against a second one written here from the spec alone (hashlib and json, none of Toren's
digest or JSON code), so the page and the code cannot drift apart. The page lists every
vector's digest too."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from toren.core.contract.audit import chain_hash, response_digest
from toren.core.contract.events import RunStarted, make_event

ROOT = Path(__file__).parents[2]
VECTORS = json.loads((ROOT / "tests/fixtures/audit_vectors.json").read_text("utf-8"))
COVERED = {
    "ModelCallRecorded": ("response", "error", "input_tokens", "output_tokens", "cost_usd"),
    "ToolCallRecorded": ("result", "error"),
}


def canon(value: Any) -> bytes:
    """§2 for the values of these vectors (sorted keys, no whitespace, UTF-8, floats in
    their shortest round-trip form)."""
    return json.dumps(
        value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False
    ).encode("utf-8")


def spec_response_digest(type_: str, fields: dict[str, Any]) -> tuple[str, str]:
    body = {"type": type_, **{k: fields.get(k) for k in COVERED[type_]}}
    text = canon(body)
    return text.decode(), hashlib.sha256(b"toren.response.v1\n" + text).hexdigest()


def spec_chain(prev: str | None, env: dict[str, Any], payload: str) -> tuple[str, str]:
    keys = ("run_id", "stream", "position", "generation", "slot", "type", "digest")
    rest = ("code_version", "worker_id")
    head = [prev, *(env[k] for k in keys), *(env[k] for k in rest), env["format_version"]]
    head.append(float(env["created_at"]))
    text = canon(head)
    digest = hashlib.sha256(b"toren.chain.v1\n" + text + b"\n" + payload.encode("utf-8"))
    return text.decode(), digest.hexdigest()


@pytest.mark.parametrize("vector", VECTORS["responses"], ids=lambda v: v["name"])
def test_response_digest_vectors(vector: dict[str, Any]) -> None:
    assert response_digest(vector["type"], vector["fields"]) == vector["digest"]
    assert spec_response_digest(vector["type"], vector["fields"]) == (
        vector["canonical"],
        vector["digest"],
    )


def test_chain_vectors() -> None:
    chains: dict[str, str] = {}
    for vector in VECTORS["chain"]:
        prev = vector["prev"]
        if isinstance(prev, str) and prev.startswith("@"):
            prev = chains[prev[1:]]
        assert prev == vector["prev_chain"]
        env = vector["envelope"]
        event = make_event(
            env["run_id"],
            RunStarted(),
            **{k: v for k, v in env.items() if k not in ("run_id", "type")},
        )
        event.__dict__["type"] = env["type"]
        assert chain_hash(prev, event, vector["payload"]) == vector["chain"], vector["name"]
        assert spec_chain(prev, env, vector["payload"]) == (
            vector["canonical_envelope"],
            vector["chain"],
        )
        chains[vector["name"]] = vector["chain"]


def test_the_spec_lists_every_vector() -> None:
    page = (ROOT / "docs" / "digest.md").read_text("utf-8")
    for vector in VECTORS["responses"]:
        assert vector["digest"] in page, vector["name"]
    for vector in VECTORS["chain"]:
        assert vector["chain"] in page, vector["name"]
