"""``toren schedules`` on the embedded database, and agent.yaml schedules fired by a real
``toren worker`` process."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from click.testing import CliRunner

from toren.cli.main import cli

from .conftest import invoke, sub_env, toren_exe


def test_the_schedule_commands(runner: CliRunner, chain: Path) -> None:
    made = invoke(
        runner, "schedules", "create", "chain/hourly", "--every", "1h", "--input", '{"ask": false}'
    )
    assert made.exit_code == 0, made.output
    assert "schedule chain/hourly: every 3600 s, active" in made.output
    listed = json.loads(invoke(runner, "schedules", "list", "--json").stdout)
    assert [(s["id"], s["every"], s["input"]) for s in listed] == [
        ("chain/hourly", 3600, {"ask": False})
    ]
    paused = invoke(runner, "schedules", "pause", "chain/hourly", "--note", "quiet week")
    assert paused.exit_code == 0 and "paused (quiet week)" in paused.output
    table = invoke(runner, "schedules", "list").output
    assert "chain/hourly" in table and "paused" in table
    triggered = invoke(runner, "schedules", "trigger", "chain/hourly")
    assert triggered.exit_code == 0 and "started run run_" in triggered.output
    done = invoke(
        runner, "schedules", "backfill", "chain/hourly", "2026-01-01T00:00", "2026-01-01T03:00"
    )
    assert "started 3 runs; 0 times of the range had already run" in done.output
    again = invoke(
        runner, "schedules", "backfill", "chain/hourly", "2026-01-01T00:00", "2026-01-01T03:00"
    )
    assert "started 0 runs; 3 times of the range had already run" in again.output
    shown = invoke(runner, "schedules", "show", "chain/hourly")
    assert shown.output.count("queued") == 4  # the triggered run and the three backfilled
    runs = json.loads(invoke(runner, "runs", "list", "--json").stdout)
    assert len(runs) == 4
    deleted = invoke(runner, "schedules", "delete", "chain/hourly")
    assert deleted.exit_code == 0
    assert json.loads(invoke(runner, "schedules", "list", "--json").stdout) == []
    missing = runner.invoke(cli, ["schedules", "show", "chain/hourly"])
    assert missing.exit_code != 0 and "no schedule 'chain/hourly'" in missing.output


def test_a_bad_definition_is_refused_before_anything_is_written(
    runner: CliRunner, chain: Path
) -> None:
    bad = runner.invoke(cli, ["schedules", "create", "chain/x", "--cron", "0 25 * * *"])
    assert bad.exit_code != 0
    assert "not a valid cron expression" in bad.output
    wrong = runner.invoke(cli, ["schedules", "create", "nonsense", "--every", "1h"])
    assert wrong.exit_code == 2 and "expected AGENT/NAME" in wrong.output
    assert not (chain.parent / ".toren").exists()  # nothing was opened or created


def test_agent_yaml_schedules_fire_in_a_worker(chain: Path) -> None:
    """An agent.yaml schedule is registered by the worker that serves the agent and fires
    every second; `toren schedules list` shows it and its runs."""
    yaml = chain / "agent.yaml"
    yaml.write_text(
        yaml.read_text()
        + "schedules:\n  - name: beat\n    every: 1s\n    overlap: allow_all\n"
        + "    input: {ask: false}\n",
        encoding="utf-8",
    )
    root = chain.parent
    before = CliRunner()
    pending = invoke(before, "schedules", "list").output
    assert "chain/beat: declared in agent.yaml; a worker registers it" in pending
    worker = subprocess.Popen(
        [*toren_exe(), "worker", "--agents", str(root)],
        cwd=root,
        env=sub_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            listed = json.loads(invoke(CliRunner(), "schedules", "list", "--json").stdout)
            if listed and listed[0]["fires"] >= 2:
                break
            assert time.monotonic() < deadline, f"the schedule did not fire: {listed}"
            time.sleep(0.2)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    beat = listed[0]
    assert beat["id"] == "chain/beat" and beat["source"] == "agent.yaml"
    runs = json.loads(invoke(CliRunner(), "runs", "list", "--json").stdout)
    assert len(runs) >= 2 and {r["agent"] for r in runs} == {"chain"}
