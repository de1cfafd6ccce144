"""``toren runs verify`` on the 0.1 fixture databases (copies): every step verified or
explicitly explained; and on a copy with one payload byte tampered with, the mismatch is
reported with its position and the command exits non-zero."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner

import toren

# v0_1_db: a private copy of the 0.1 database on each backend (a fixture).
from tests.compat.test_v0_1_fixtures import MANIFEST, Raw, v0_1_db  # noqa: F401
from toren.cli.main import cli
from toren.cli.verify import EXIT_MISMATCH

# Recorded steps of the 0.1 fixtures (first events of steps; completions are checked
# against them). 0.1 did not record the name of a timed message wait that received
# nothing: those steps are read with the names the run recorded waiting for, and say so.
V0_1_STEPS = 65


def _verify(url: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["runs", "verify", "--database-url", url, *args])


def _reports(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_every_step_of_the_0_1_databases_verifies(
    v0_1_db: tuple[str, str],  # noqa: F811
) -> None:
    backend, url = v0_1_db
    done = _verify(url, "--all", "--json", "--strict")
    assert done.exit_code == 0, done.output
    reports = _reports(done.stdout)
    assert len(reports) == len(MANIFEST["runs"])
    checks = [c for r in reports for c in r["checks"]]
    assert len(checks) == V0_1_STEPS
    assert {c["verdict"] for c in checks} == {"verified"}
    explained = [c for c in checks if c["note"]]
    # The timed waits that received nothing: verified, and the report says how.
    assert explained and all(c["kind"] == "message" for c in explained)
    assert all("RunWaiting.messages" in c["note"] for c in explained)
    # 0.1 wrote no response digests and no chain: reported as not covered, not a failure.
    responses = [c for c in checks if c["kind"] in ("model", "tool")]
    assert responses and {c["response"] for c in responses} == {"not covered"}
    assert all("earlier version" in c["response_note"] for c in responses)
    assert {c["response"] for c in checks if c not in responses} <= {"none"}
    assert all(r["chain"]["linked"] == 0 and not r["chain"]["breaks"] for r in reports)
    assert all(r["chain"]["not_covered"] > 0 for r in reports)

    human = _verify(url, "--all")
    assert human.exit_code == 0, human.output
    assert f"{len(reports)} runs, {V0_1_STEPS} steps: {V0_1_STEPS} verified" in human.output
    assert "response not covered (recorded by an earlier version)" in human.output
    assert "chain: not covered (recorded by an earlier version)" in human.output


def test_a_tampered_payload_byte_is_a_mismatch_with_its_position(
    v0_1_db: tuple[str, str],  # noqa: F811
) -> None:
    backend, url = v0_1_db
    raw = Raw(backend, url)
    try:
        ((seq, run_id, stream, position, payload),) = raw.all(
            "SELECT seq, run_id, stream, position, payload FROM events "
            "WHERE type = 'ToolCallRecorded' ORDER BY seq LIMIT 1"
        )
        tampered = payload.replace('"A-17"', '"A-18"', 1)  # one byte of the arguments
        assert sum(a != b for a, b in zip(payload, tampered, strict=True)) == 1
        raw.x("UPDATE events SET payload = ? WHERE seq = ?", (tampered, seq))
    finally:
        raw.close()

    done = _verify(url, run_id)
    assert done.exit_code == EXIT_MISMATCH, done.output
    assert re.search(
        rf"MISMATCH\s+seq {seq}\s+{stream}:{position} \(generation 0\)\s+tool", done.output
    )
    assert "1 mismatch;" in done.output and "1 mismatches" not in done.output

    report = _reports(_verify(url, run_id, "--json").stdout)[0]
    (bad,) = [c for c in report["checks"] if c["verdict"] == "mismatch"]
    assert (bad["seq"], bad["stream"], bad["position"]) == (seq, stream, position)
    assert bad["derived_digest"] != bad["recorded_digest"]
    assert report["verified"] == len(report["checks"]) - 1

    everything = _verify(url, "--all")
    assert everything.exit_code == EXIT_MISMATCH


def test_a_tampered_message_blob_is_a_mismatch(
    v0_1_db: tuple[str, str],  # noqa: F811
) -> None:
    """The digest covers message hashes; a stored body that no longer hashes to its
    address is caught too, at every model call that sent it."""
    backend, url = v0_1_db
    raw = Raw(backend, url)
    try:
        rows = raw.all("SELECT hash, body FROM blobs ORDER BY hash")
        address, body = next((h, b) for h, b in rows if '"role":"user"' in b)
        raw.x("UPDATE blobs SET body = ? WHERE hash = ?", (body.replace("e", "E", 1), address))
    finally:
        raw.close()
    done = _verify(url, "--all", "--json")
    assert done.exit_code == EXIT_MISMATCH
    bad = [c for r in _reports(done.stdout) for c in r["checks"] if c["verdict"] == "mismatch"]
    assert bad and all(c["kind"] == "model" and address in c["note"] for c in bad)


def test_verify_needs_a_run_or_all(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/none.db"
    assert CliRunner().invoke(cli, ["runs", "verify", "--database-url", url]).exit_code == 2
    missing = CliRunner().invoke(cli, ["runs", "verify", "--database-url", url, "run_nope"])
    assert missing.exit_code == 5 and "no database" in missing.output

    async def create() -> None:
        await (await toren.connect(url)).close()

    asyncio.run(create())
    unknown = CliRunner().invoke(cli, ["runs", "verify", "--database-url", url, "run_nope"])
    assert unknown.exit_code == 5 and "run_nope" in unknown.output
