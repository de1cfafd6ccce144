"""``toren`` as real processes: `toren dev` reloading an edited agent mid-run, `toren run`
killed with SIGKILL and finished by `toren runs resume`, and `toren worker` draining on
SIGTERM. What was paid for is counted with the scripted provider's ledger."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import free_port, ledger, sub_env, toren_exe


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def model_calls(events: list[Any]) -> list[Any]:
    return [e for e in events if e.type == "ModelCallRecorded"]


def test_dev_reloads_an_edited_prompt_mid_run(
    chain: Path, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    from toren.client import TorenClient

    paid = tmp_path / "ledger.jsonl"
    port = free_port()
    dev = subprocess.Popen(
        [*toren_exe(), "dev", str(chain), "--port", str(port), "--no-console"],
        env=sub_env(TOREN_SCRIPTED_LEDGER=str(paid)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    procs.append(dev)
    banner = ""
    assert dev.stdout is not None
    while "watching for changes" not in banner:
        line = dev.stdout.readline()
        assert line, f"toren dev exited early:\n{banner}"
        banner += line
    url = f"http://127.0.0.1:{port}"
    assert f"API      {url}/v1" in banner

    with TorenClient(url) as client:
        run = client.start_run("chain", {})
        # Steps 0 and 1 are recorded; step 2 (slow) is in flight: edit step 1's prompt.
        wait_until(
            lambda: len(model_calls(client.events(run.id).events)) >= 2, 20, "two model steps"
        )
        first_version = client.get_run(run.id).code_version
        (chain / "prompts" / "step1.md").write_text("Summarise briefly, v2.\n")
        done = client.wait(run.id, timeout=30)
        assert done.status == "completed", done.error
        events = client.events(run.id, limit=500).events

    invalidations = [e for e in events if e.type == "StreamInvalidated"]
    assert len(invalidations) == 1
    assert invalidations[0].payload["from_pos"] == 1
    assert invalidations[0].payload["code_version"] == done.code_version != first_version
    served = [c["last_user"] for c in ledger(paid)]
    assert served.count("step 0") == 1  # replayed after the reload, not paid again
    assert served.count("step 1: Summarise politely.") == 1  # the old prompt, once
    assert served.count("step 1: Summarise briefly, v2.") == 1  # the new prompt, once
    # In flight at the reload: it finished and was recorded under the old version (the drain
    # a deploy gets), then ran again only because step 1 changed its history: never the
    # identical request twice, and both calls counted.
    assert served.count("step 2 slow") == 2
    step2 = [e for e in model_calls(events) if e.position == 2]
    assert len(step2) == 2 and step2[0].digest != step2[1].digest
    assert step2[0].code_version == first_version != step2[1].code_version
    assert served.count("step 3") == 1

    dev.send_signal(signal.SIGINT)
    rest, _ = dev.communicate(timeout=20)
    assert dev.returncode == 0, rest
    assert "reloaded (prompts/step1.md)" in rest
    assert "stopped" in rest


def test_run_killed_with_sigkill_then_resumed(
    chain: Path, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    paid = tmp_path / "ledger.jsonl"
    # A lease far longer than the test may take: the resume cannot wait it out, it must
    # see that the holder's process on this host is gone and take the run over at once.
    env = sub_env(
        TOREN_SCRIPTED_LEDGER=str(paid), TOREN_LEASE_TTL="600", TOREN_LEASE_HEARTBEAT="0.3"
    )
    run = subprocess.Popen(
        [*toren_exe(), "run", str(chain), "--input", "{}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    procs.append(run)
    # Steps 0 and 1 paid; step 2 is sleeping in the scripted model: kill the process.
    wait_until(lambda: len(ledger(paid)) >= 2, 20, "two paid steps")
    time.sleep(0.3)
    run.send_signal(signal.SIGKILL)
    run.wait(10)
    assert run.returncode == -signal.SIGKILL

    listed = subprocess.run(
        [*toren_exe(), "runs", "list", "--agents", str(chain), "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    (record,) = json.loads(listed.stdout)
    assert record["status"] in ("queued", "running")  # not finished: its worker is dead

    resumed = subprocess.run(
        [*toren_exe(), "runs", "resume", record["id"], "--agents", str(chain)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "waiting for its lease" not in resumed.stdout, resumed.stdout[:300]
    assert re.search(
        r"was held by worker \S+, which is gone \(its process \d+ on this host no longer "
        r"exists\): taking it over now",
        resumed.stdout,
    ), resumed.stdout[:400]
    assert "✔ completed" in resumed.stdout

    served = [c["last_user"] for c in ledger(paid)]
    assert served == ["step 0", "step 1: Summarise politely.", "step 2 slow", "step 3"]
    shown = subprocess.run(
        [*toren_exe(), "runs", "show", record["id"], "--agents", str(chain), "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(shown.stdout)
    assert data["status"] == "completed" and data["lease_recoveries"] == 1


def test_worker_runs_queued_runs_and_drains_on_sigterm(
    chain: Path, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    env = sub_env(TOREN_AGENTS=str(chain))
    started = subprocess.run(
        [*toren_exe(), "run", "chain", "--input", "{}", "--detach"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    run_id = started.stdout.strip()
    worker = subprocess.Popen(
        [*toren_exe(), "worker", "--concurrency", "4", "--drain-window", "5"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    procs.append(worker)

    def status() -> str:
        shown = subprocess.run(
            [*toren_exe(), "runs", "show", run_id, "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return str(json.loads(shown.stdout)["status"])

    wait_until(lambda: status() == "completed", 30, "the worker to finish the run")
    worker.send_signal(signal.SIGTERM)
    output, _ = worker.communicate(timeout=20)
    assert worker.returncode == 0, output
    assert "draining" in output and "stopped" in output


@pytest.mark.parametrize("signame", ["SIGINT"])
def test_interrupted_run_says_how_to_resume(
    chain: Path, procs: list[subprocess.Popen[str]], signame: str
) -> None:
    run = subprocess.Popen(
        [*toren_exe(), "run", str(chain), "--input", "{}"],
        env=sub_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    procs.append(run)
    assert run.stdout is not None
    seen = ""
    while "main/1" not in seen:  # step 1 printed: step 2 (slow) is running
        line = run.stdout.readline()
        assert line, seen
        seen += line
    run.send_signal(getattr(signal, signame))
    rest, _ = run.communicate(timeout=20)
    assert run.returncode == 130, seen + rest
    assert "toren runs resume run_" in rest


def test_worker_on_postgresql_without_psycopg_says_to_install_it(
    tmp_path: Path, chain: Path
) -> None:
    """Issue 40 item 8: the postgres extra missing is a package to install, not a
    database URL to check. (A ``psycopg`` that cannot be imported stands first on the
    path, as when the extra was never installed.)"""
    shadow = tmp_path / "shadow" / "psycopg"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'psycopg'\")\n")
    done = subprocess.run(
        [
            *toren_exe(),
            "worker",
            "--agents",
            str(chain),
            "--database-url",
            "postgresql://postgres@127.0.0.1:5432/postgres",
        ],
        env=sub_env(PYTHONPATH=str(shadow.parent)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 5, done.stderr
    error, hint = [
        line for line in done.stderr.splitlines() if line.startswith(("error:", "hint:"))
    ]
    assert error == (
        "error: PostgreSQL support needs psycopg, which is not installed: "
        "pip install 'toren-run[postgres]'"
    )
    assert hint.startswith("hint: install it where toren runs: pip install 'toren-run[postgres]'")
    assert "--database-url" not in hint
