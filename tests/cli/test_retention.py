"""toren runs prune | export | import through click's runner, on the embedded database."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tests.cli.conftest import invoke, last_run_id


def test_export_prune_import_from_the_command_line(
    runner: CliRunner, chain: Path, tmp_path: Path
) -> None:
    assert invoke(runner, "run", "chain").exit_code == 0
    done = last_run_id(runner, chain)
    assert invoke(runner, "run", "./chain", "--input", '{"ask": true}').exit_code == 4
    waiting = last_run_id(runner, chain)
    before = invoke(runner, "runs", "events", done, "--agents", "chain", "--json").stdout

    dry = invoke(
        runner,
        "runs",
        "prune",
        "--agents",
        "chain",
        "--finished-before",
        "0s",
        "--dry-run",
        "--json",
    )
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["runs"] == 1
    assert invoke(runner, "runs", "show", done, "--agents", "chain").exit_code == 0

    archive = tmp_path / "archive.jsonl"
    pruned = invoke(
        runner,
        "runs",
        "prune",
        "--agents",
        "chain",
        "--finished-before",
        "0s",
        "--export",
        str(archive),
        "--json",
    )
    assert pruned.exit_code == 0, pruned.output
    assert json.loads(pruned.stdout)["runs"] == 1
    assert invoke(runner, "runs", "show", done, "--agents", "chain").exit_code == 5
    listed = json.loads(invoke(runner, "runs", "list", "--agents", "chain", "--json").stdout)
    assert [r["id"] for r in listed] == [waiting]

    imported = invoke(runner, "runs", "import", "--agents", "chain", str(archive), "--json")
    assert imported.exit_code == 0, imported.output
    assert json.loads(imported.stdout)["runs"] == 1
    after = invoke(runner, "runs", "events", done, "--agents", "chain", "--json").stdout
    assert after == before

    exported = invoke(runner, "runs", "export", "--agents", "chain", waiting)
    assert exported.exit_code == 0
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert lines[0]["toren_export"] == 1 and lines[1]["row"]["id"] == waiting


def test_bad_retention_arguments_are_usage_errors(runner: CliRunner, chain: Path) -> None:
    assert invoke(runner, "run", "chain").exit_code == 0
    bad = invoke(runner, "runs", "prune", "--agents", "chain", "--finished-before", "a month")
    assert bad.exit_code == 2 and "expected a number with a unit" in bad.output
    waiting = invoke(
        runner,
        "runs",
        "prune",
        "--agents",
        "chain",
        "--finished-before",
        "1d",
        "--status",
        "waiting",
    )
    assert waiting.exit_code == 2
    both = invoke(runner, "runs", "export", "--agents", "chain", "run_x", "--finished-before", "1d")
    assert both.exit_code == 2 and "either run ids or --finished-before" in both.output
    unknown = invoke(runner, "runs", "export", "--agents", "chain", "run_000000000000aaaaaaaaaa")
    assert unknown.exit_code == 5 and "no run with id" in unknown.output


def test_counts_of_one_are_singular(runner: CliRunner, chain: Path, tmp_path: Path) -> None:
    """Issue 40 item 10: "exported 1 run", "1 mismatch", not "1 runs", "1 mismatches"."""
    from toren.cli._common import counted

    assert invoke(runner, "run", "chain").exit_code == 0
    listed = json.loads(invoke(runner, "runs", "list", "--agents", "chain", "--json").stdout)
    archive = tmp_path / "one.jsonl"
    where = ("--agents", "chain", "-o", str(archive))
    exported = invoke(runner, "runs", "export", listed[0]["id"], *where)
    assert exported.exit_code == 0, exported.output
    assert exported.stderr.strip() == "exported 1 run"
    assert [counted(n, "mismatch", "mismatches") for n in (0, 1, 2)] == [
        "0 mismatches",
        "1 mismatch",
        "2 mismatches",
    ]
    checked = invoke(runner, "runs", "verify", "--all", "--agents", "chain")
    assert "1 run, " in checked.stdout and "0 mismatches" in checked.stdout, checked.output
