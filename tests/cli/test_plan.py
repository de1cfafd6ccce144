"""``toren plan``: clean before a change, the exact invalidation after it, and a non-zero
exit with --fail-on-invalidation so it can gate a deploy."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tests.cli.conftest import invoke, last_run_id


def test_plan_reports_then_gates(runner: CliRunner, chain: Path) -> None:
    assert invoke(runner, "run", "chain", "--input", '{"ask": true}').exit_code == 4
    run_id = last_run_id(runner, chain)

    clean = invoke(runner, "plan", "--agents", "chain", "--fail-on-invalidation")
    assert clean.exit_code == 0, clean.output
    assert "1 runs in flight: 1 replay cleanly, 0 would be invalidated" in clean.output

    (chain / "prompts" / "step1.md").write_text("An edited prompt.\n", encoding="utf-8")
    report = invoke(runner, "plan", "--agents", "chain", "--json")
    assert report.exit_code == 0
    data = json.loads(report.stdout)
    assert data["invalidated"] == 1
    (finding,) = data["plans"][0]["findings"]
    assert (data["plans"][0]["run_id"], finding["stream"], finding["from_pos"]) == (
        run_id,
        "main",
        1,
    )
    assert finding["suffix_model_calls"] == 1
    assert [c["text"] for c in finding["changes"]] == ["message 2 (user) changed"]

    gate = invoke(runner, "plan", "--agents", "chain", "--fail-on-invalidation")
    assert gate.exit_code == 6
    assert run_id in gate.output and "would be invalidated" in gate.output
    assert "message 2 (user) changed" in " ".join(gate.output.split())  # what changed

    # The run's log, verified: every digest re-derives (exit 0).
    verified = invoke(runner, "runs", "verify", run_id, "--agents", "chain")
    assert verified.exit_code == 0, verified.output
    assert "2 steps, 2 verified, 0 cannot be verified, 0 mismatches" in verified.output

    # The real resume then invalidates exactly there.
    assert (
        invoke(runner, "runs", "send", run_id, "approval", "yes", "--agents", "chain").exit_code
        == 0
    )
    assert invoke(runner, "runs", "resume", run_id, "--agents", "chain").exit_code == 0
    events = json.loads(
        "["
        + ",".join(
            invoke(runner, "runs", "events", run_id, "--agents", "chain", "--json").stdout.split(
                "\n"
            )[:-1]
        )
        + "]"
    )
    # --json carries the whole envelope of docs/event-log.md, slot included.
    envelope = {"seq", "run_id", "type", "stream", "position", "generation", "slot"}
    assert all(envelope | {"digest", "code_version", "worker_id"} <= set(e) for e in events)
    assert events[0]["slot"] == "run:start" and events[-1]["slot"] == "run:end"
    inv = [e for e in events if e["type"] == "StreamInvalidated"]
    assert inv and inv[0]["slot"] == "main#0:inv"
    assert [
        (e["stream"], e["payload"]["from_pos"], e["payload"]["expected_digest"]) for e in inv
    ] == [("main", 1, finding["expected_digest"])]


def test_plan_says_when_runs_were_left_out(runner: CliRunner, chain: Path) -> None:
    """Without --limit every in-flight run is planned (a pre-deploy check that skipped some
    would vouch for runs it never replayed); with one, the report says runs were left out."""
    for _ in range(3):
        assert invoke(runner, "run", "chain", "--input", '{"ask": true}').exit_code == 4

    every = json.loads(invoke(runner, "plan", "--agents", "chain", "--json").stdout)
    assert (every["runs"], every["more"]) == (3, False)

    capped = invoke(runner, "plan", "--agents", "chain", "--limit", "2")
    assert capped.exit_code == 0, capped.output
    assert "2 runs in flight" in capped.output
    assert "more runs are in flight than the 2 planned" in " ".join(capped.output.split())
    gate = invoke(runner, "plan", "--agents", "chain", "--limit", "2", "--fail-on-invalidation")
    assert gate.exit_code == 6, gate.output  # a partial plan cannot pass a deploy gate
    assert "a gate cannot vouch for them" in " ".join(gate.output.split())
    data = json.loads(invoke(runner, "plan", "--agents", "chain", "--limit", "2", "--json").stdout)
    assert (data["runs"], data["more"]) == (2, True)

    exact = json.loads(invoke(runner, "plan", "--agents", "chain", "--limit", "3", "--json").stdout)
    assert (exact["runs"], exact["more"]) == (3, False)

    refused = invoke(runner, "plan", "--agents", "chain", "--limit", "0")
    assert refused.exit_code == 2 and "--limit" in refused.output
