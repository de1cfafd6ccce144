"""``toren run --input`` and ``toren runs send``: the nesting limit of run inputs and message
payloads (64 levels), in the same words as the host and HTTP APIs, checked before either
backend is reached, so nothing is stored (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from toren.store import connect

from ..core.test_input_depth import nested
from .conftest import invoke

TOO_DEEP_TEXT = '{"deep": ' + "[" * 5000 + "]" * 5000 + "}"  # past Python's JSON parser
NOWHERE = "http://127.0.0.1:9"  # no server: the check must come first


def _stored(db_url: str, run_id: str | None = None) -> tuple[list[str], Any]:
    async def read() -> tuple[list[str], Any]:
        store = await connect(db_url)
        try:
            runs = [r.id for r in await store.list_runs()]
            message = await store.next_message(run_id, ["approval"]) if run_id else None
            return runs, message
        finally:
            await store.close()

    return asyncio.run(read())


def test_toren_run_refuses_a_too_deep_input_and_stores_nothing(
    runner: CliRunner, chain: Path, db_url: str
) -> None:
    (chain.parent / "d65.json").write_text(json.dumps({"deep": nested(64)}))
    (chain.parent / "d5001.json").write_text(TOO_DEEP_TEXT)
    for name, depth in (("d65.json", 65), ("d5001.json", 5001)):
        for where in (["--database-url", db_url], ["--url", NOWHERE]):
            result = invoke(runner, "run", "chain", "--input", f"@{name}", *where)
            assert result.exit_code == 2, result.output
            error = " ".join(result.stderr.split())  # click wraps long lines
            assert (
                f"Invalid value for '--input': run input nests objects and arrays {depth} "
                "levels deep (level 65 at input.deep" in error
            ), error
            assert "); expected at most 64 levels" in error
    assert _stored(db_url)[0] == []


def test_toren_runs_send_refuses_a_too_deep_payload_and_stores_nothing(
    runner: CliRunner, chain: Path, db_url: str
) -> None:
    started = invoke(runner, "run", "chain", "--input", '{"ask": true}', "--database-url", db_url)
    assert started.exit_code == 4, started.output  # parked, waiting for 'approval'
    (run_id,) = _stored(db_url)[0]
    (chain.parent / "d65.json").write_text(json.dumps(nested(65)))
    for payload, depth in (
        ("@d65.json", 65),
        (json.dumps(nested(65)), 65),
        (TOO_DEEP_TEXT, 5001),  # JSON too deep to parse is no plain-text payload either
    ):
        for where in (["--database-url", db_url], ["--url", NOWHERE]):
            result = invoke(runner, "runs", "send", run_id, "approval", payload, *where)
            assert result.exit_code == 2, result.output
            error = " ".join(result.stderr.split())
            assert (
                f"Invalid value for 'PAYLOAD': message payload nests objects and arrays {depth} "
                "levels deep (level 65 at payload" in error
            ), error
            assert "); expected at most 64 levels" in error
    assert _stored(db_url, run_id)[1] is None

    ok = invoke(
        runner, "runs", "send", run_id, "approval", json.dumps(nested(64)), "--database-url", db_url
    )
    assert ok.exit_code == 0, ok.output
    assert _stored(db_url, run_id)[1].payload == nested(64)
