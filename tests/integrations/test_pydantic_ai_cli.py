"""The pydantic-ai scaffold through the CLI: `toren init --template pydantic-ai` writes an
agent that runs offline on the first try; `toren runs verify` re-derives its digests."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.cli.conftest import invoke, last_run_id
from toren.cli.main import cli

pytest.importorskip("pydantic_ai")


def test_the_pydantic_ai_scaffold_runs_offline_and_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    monkeypatch.chdir(tmp_path)
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "TOREN_DATABASE_URL"):
        monkeypatch.delenv(key, raising=False)
    result = invoke(runner, "init", "weather", "--template", "pydantic-ai")
    assert result.exit_code == 0, result.output
    target = tmp_path / "weather"
    assert "entry: app:agent" in (target / "agent.yaml").read_text()
    assert "toren-run[pydantic-ai]" in (target / "pyproject.toml").read_text()
    assert not (target / "tools.py").exists() and not (target / "script.yaml").exists()

    ran = invoke(runner, "run", "weather", "What is the weather in Paris?")
    assert ran.exit_code == 0, ran.output
    assert "⚙ tool get_weather" in ran.stdout
    assert "✔ completed" in ran.stdout and "sunny, up to 21 °C" in ran.stdout

    run_id = last_run_id(runner, target)
    verified = invoke(runner, "runs", "verify", run_id, "--agents", str(target))
    assert verified.exit_code == 0, verified.output
    assert "3 steps: 3 verified, 0 cannot be verified, 0 mismatches" in verified.stdout


def test_an_unknown_template_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["init", str(tmp_path / "x"), "--template", "langchain"])
    assert result.exit_code == 2
    assert "'langchain' is not one of 'default', 'pydantic-ai'" in result.output
