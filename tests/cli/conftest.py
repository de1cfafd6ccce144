"""Fixtures of the CLI tests: agent projects copied into a temporary directory, a click
runner, and helpers to run ``toren`` as a real subprocess."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from toren.cli.main import cli

HERE = Path(__file__).parent
CHAIN = HERE / "agents" / "chain"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the ``chain`` test agent; the working directory is its parent."""
    target = tmp_path / "chain"
    shutil.copytree(CHAIN, target)
    monkeypatch.chdir(tmp_path)
    for var in ("TOREN_DATABASE_URL", "TOREN_API_URL", "TOREN_API_TOKEN", "TOREN_AGENTS"):
        monkeypatch.delenv(var, raising=False)
    return target


def invoke(runner: CliRunner, *args: str, **kw: Any) -> Result:
    return runner.invoke(cli, list(args), catch_exceptions=False, **kw)


def last_run_id(runner: CliRunner, agents: Path) -> str:
    result = invoke(runner, "runs", "list", "--agents", str(agents), "--json")
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)[0]["id"])


# -- subprocesses -----------------------------------------------------------------------


def toren_exe() -> list[str]:
    return [sys.executable, "-c", "from toren.cli.main import main; main()"]


def sub_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TOREN_") and k not in ("NO_COLOR", "FORCE_COLOR")
    }
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ledger(path: Path) -> list[dict[str, Any]]:
    from toren.providers.scripted import read_ledger

    return read_ledger(path)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Subprocesses started by a test, killed (by pid) if still running at the end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
