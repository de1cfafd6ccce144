"""The first-use traps, each gone: the ``curl`` example of ``toren dev --help`` works
verbatim, ``toren dev`` prints one line per run started and ended and warns in a folder
with no agent, ``toren plan`` is not cut to 80 columns in a pipe, and a deprecated
agent.yaml key is one line naming the file and the new key."""

from __future__ import annotations

import queue
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.cli.conftest import free_port, invoke, sub_env, toren_exe

SRC = Path(__file__).parents[2] / "src"


def _env(**extra: str) -> dict[str, str]:
    # This checkout's code in the subprocess, whatever the working directory.
    return sub_env(PYTHONPATH=str(SRC), **extra)


class _Lines:
    """The output of a subprocess, line by line, read on a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(target=lambda: [self._queue.put(x) for x in stdout], daemon=True).start()

    def until(self, pattern: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            self.seen.append(line)
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(self.seen)}")


def test_the_curl_example_works_verbatim_and_dev_prints_each_run(
    runner: CliRunner, chain: Path, procs: list[subprocess.Popen[str]]
) -> None:
    help_text = invoke(runner, "dev", "--help").output
    (example,) = [line.strip() for line in help_text.splitlines() if "curl" in line]
    assert "content-type: application/json" in example
    (chain / "agent.yaml").write_text(
        (chain / "agent.yaml").read_text().replace("name: chain", "name: hello")
    )
    port = free_port()
    dev = subprocess.Popen(
        [*toren_exe(), "dev", str(chain), "--port", str(port), "--no-console"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    procs.append(dev)
    lines = _Lines(dev)
    lines.until("watching for changes")
    # The example as printed; only the port differs (8000 may be taken on this machine).
    command = shlex.split(example.replace("localhost:8000", f"localhost:{port}"))
    answer = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
    assert '"status":"queued"' in answer.stdout.replace(" ", ""), answer.stdout
    run_id = re.search(r'"id":\s*"(run_[0-9a-f]+)"', answer.stdout)
    assert run_id is not None, answer.stdout
    started = lines.until(rf"run {run_id[1]} started")
    assert started.strip() == f"▶ run {run_id[1]} started (agent hello)"
    ended = lines.until(rf"run {run_id[1]} (completed|failed)")
    assert ended.strip() == f"■ run {run_id[1]} completed"


def test_dev_warns_when_the_folder_holds_no_agent(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    dev = subprocess.Popen(
        [*toren_exe(), "dev", str(empty), "--port", str(free_port()), "--no-console"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    procs.append(dev)
    warning = _Lines(dev).until("warning:")
    assert warning.strip() == (
        f"warning: no agent in {empty}: no agent.yaml here nor in its subdirectories. "
        "Create one with toren init (or save an agent.yaml: toren dev picks it up)"
    )


def test_a_deprecated_key_is_one_line_naming_the_file_and_the_new_key(tmp_path: Path) -> None:
    agent = tmp_path / "old"
    agent.mkdir()
    (agent / "agent.yaml").write_text("name: old\nmodel: scripted:echo\nsystem_prompt: Hi.\n")
    done = subprocess.run(
        [*toren_exe(), "run", str(agent), "hello"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"warning: {agent / 'agent.yaml'}: 'system_prompt' is deprecated, use 'instructions' "
        "instead; 'system_prompt' will stop being accepted in toren-run 0.3.0"
    ]


def test_plan_is_not_cut_to_80_columns_in_a_pipe(
    runner: CliRunner, chain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # COLUMNS, when set, still decides
    long_name = "a-support-agent-with-a-rather-long-name"
    yaml = chain / "agent.yaml"
    yaml.write_text(yaml.read_text().replace("name: chain", f"name: {long_name}"))
    assert invoke(runner, "run", str(chain), "--input", '{"ask": true}').exit_code == 4
    (chain / "prompts" / "step1.md").write_text("An edited prompt.\n", encoding="utf-8")
    report = invoke(runner, "plan", "--agents", "chain")
    assert report.exit_code == 0, report.output
    # The table's rows (the lines under it that say what changed name the run too).
    rows = [
        line for line in report.stdout.splitlines() if line.startswith("run_") and "#" not in line
    ]
    assert len(rows) == 1, report.stdout
    row = rows[0]
    assert "…" not in report.stdout
    assert re.search(rf"{long_name}\s+waiting\s+main\s+1\s+[0-9a-f]{{12}}\s+[0-9a-f]{{12}}", row)
