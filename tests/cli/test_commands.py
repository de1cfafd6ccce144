"""Every command through click's runner: the happy paths, exit codes and error paths."""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from tests.cli.conftest import CHAIN, invoke, last_run_id
from toren.cli.main import cli
from toren.errors import RunNotFound

COMMANDS = [
    [],
    ["init"],
    ["dev"],
    ["run"],
    ["runs"],
    ["runs", "list"],
    ["runs", "show"],
    ["runs", "events"],
    ["runs", "send"],
    ["runs", "cancel"],
    ["runs", "resume"],
    ["worker"],
    ["serve"],
    ["version"],
    ["plan"],
    ["schedules"],
    ["schedules", "list"],
    ["schedules", "show"],
    ["schedules", "create"],
    ["schedules", "pause"],
    ["schedules", "resume"],
    ["schedules", "trigger"],
    ["schedules", "backfill"],
    ["schedules", "delete"],
]


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "toren")
def test_every_command_has_help_with_examples(runner: CliRunner, path: list[str]) -> None:
    result = invoke(runner, *path, "--help")
    assert result.exit_code == 0, result.output
    assert "Examples:" in result.output
    assert "Usage: toren" in result.output


def test_deploy_aws_is_registered_lazily(runner: CliRunner) -> None:
    result = invoke(runner, "--help")
    assert "deploy-aws" in result.output
    assert "plan" in result.output.split()


def test_init_scaffolds_and_refuses_to_overwrite(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "hello"
    result = invoke(runner, "init", str(target))
    assert result.exit_code == 0, result.output
    agent_yaml = (target / "agent.yaml").read_text()
    assert agent_yaml.startswith("$schema: https://")
    assert "name: hello" in agent_yaml
    assert "\nmodel: scripted:script.yaml" in agent_yaml
    assert "# model: openai:gpt-4o-mini" in agent_yaml
    assert "# model: anthropic:" in agent_yaml
    assert '"toren-run>=0.1,<1"' in (target / "pyproject.toml").read_text()
    assert ".toren/" in (target / ".gitignore").read_text().splitlines()
    assert "def get_weather" in (target / "tools.py").read_text()
    for name in ("Dockerfile", "compose.yaml", "README.md", "script.yaml", "prompts/system.md"):
        assert (target / name).is_file(), name
    # Toren from an index or from a checkout: both named, and the one place that says how.
    readme = " ".join((target / "README.md").read_text().split())
    assert "pip install /path/to/toren" in readme and "from your package index" in readme
    assert '"Installing Toren" of Toren\'s docs/deploy.md' in readme
    deploy = (Path(__file__).parents[2] / "docs" / "deploy.md").read_text()
    assert "## Installing Toren: from a package index or from a checkout" in deploy
    assert "Until `toren-run` is published" not in deploy  # it is both, said once

    again = invoke(runner, "init", str(target))
    assert again.exit_code == 5
    assert "agent.yaml" in again.stderr and "tools.py" in again.stderr
    assert "--force" in again.stderr

    (target / "tools.py").write_text("# mine\n")
    forced = invoke(runner, "init", str(target), "--force")
    assert forced.exit_code == 0
    assert "def get_weather" in (target / "tools.py").read_text()


def test_toren_run_an_agent_on_scripted_echo(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "echo").mkdir()
    (tmp_path / "echo" / "agent.yaml").write_text("name: echo\nmodel: scripted:echo\n")
    result = invoke(runner, "run", "echo", "say it back")
    assert result.exit_code == 0, result.output
    assert "◆ model scripted:echo" in result.stdout
    assert "✔ completed" in result.stdout and "say it back" in result.stdout


def test_scaffolded_agent_runs_and_is_inspectable(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert invoke(runner, "init", "hello").exit_code == 0
    result = invoke(runner, "run", "hello", "What is the weather in Paris?")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "◆ model scripted:script.yaml" in out
    assert "⚙ tool get_weather" in out
    assert "✔ completed" in out and "always looks up Paris" in out
    assert (tmp_path / "hello" / ".toren" / "toren.db").is_file()
    # Asked about Lyon, it does not answer about Paris as if it were Lyon (issue 40 item 10).
    lyon = invoke(runner, "run", "hello", "What is the weather in Lyon?")
    assert lyon.exit_code == 0, lyon.output
    said = " ".join(lyon.stdout.split())
    assert "You asked: What is the weather in Lyon?" in said
    assert "always looks up Paris" in said and "sunny in Paris" not in said

    run_id = last_run_id(runner, tmp_path / "hello")
    shown = invoke(runner, "runs", "show", run_id, "--agents", "hello", "--json")
    data = json.loads(shown.stdout)
    assert data["status"] == "completed" and data["usage"]["steps"] == 3
    assert "sunny" in data["output"]["answer"]

    lines = invoke(runner, "runs", "events", run_id, "--agents", "hello", "--json").stdout
    events = [json.loads(line) for line in lines.splitlines()]
    assert [e["type"] for e in events][0] == "RunStarted"
    assert events[-1]["type"] == "RunCompleted"
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)

    human = invoke(runner, "runs", "list", "--agents", "hello")
    assert run_id in human.stdout and "completed" in human.stdout
    assert (
        "ToolCallRecorded" in invoke(runner, "runs", "events", run_id, "--agents", "hello").stdout
    )


def test_failed_run_exits_1_without_traceback(runner: CliRunner, chain: Path) -> None:
    result = invoke(runner, "run", "chain", "--input", '{"fail": true}')
    assert result.exit_code == 1
    assert "✘ failed" in result.stdout and "gave up on purpose" in result.stdout
    assert "Traceback" not in result.output


def test_waiting_run_exits_4_then_send_and_resume(runner: CliRunner, chain: Path) -> None:
    result = invoke(runner, "run", "./chain", "--input", '{"ask": true}')
    assert result.exit_code == 4, result.output
    assert "waiting for message 'approval'" in result.stdout
    run_id = last_run_id(runner, chain)
    assert f"toren runs send {run_id} approval" in result.stdout

    sent = invoke(runner, "runs", "send", run_id, "approval", "yes", "--agents", "chain")
    assert sent.exit_code == 0, sent.output
    resumed = invoke(runner, "runs", "resume", run_id, "--agents", "chain")
    assert resumed.exit_code == 0, resumed.output
    assert "✉ message 'approval': yes" in resumed.stdout
    data = json.loads(invoke(runner, "runs", "show", run_id, "--agents", "chain", "--json").stdout)
    assert data["status"] == "completed" and data["output"]["approval"] == "yes"


def test_cancel_a_waiting_run(runner: CliRunner, chain: Path) -> None:
    assert invoke(runner, "run", "chain", "--input", '{"ask": true}').exit_code == 4
    run_id = last_run_id(runner, chain)
    result = invoke(runner, "runs", "cancel", run_id, "--agents", "chain")
    assert result.exit_code == 0, result.output
    assert "cancelled" in result.stdout
    assert invoke(runner, "runs", "resume", run_id, "--agents", "chain").exit_code == 3
    listed = json.loads(
        invoke(
            runner, "runs", "list", "--agents", "chain", "--status", "cancelled", "--json"
        ).stdout
    )
    assert [r["id"] for r in listed] == [run_id]


def test_detach_then_resume(runner: CliRunner, chain: Path) -> None:
    result = invoke(runner, "run", "chain", "--input", '{"ask": true}', "--detach")
    assert result.exit_code == 0
    run_id = result.stdout.strip()
    assert run_id.startswith("run_")
    assert "toren runs resume" in result.stderr
    assert invoke(runner, "runs", "resume", run_id, "--agents", "chain").exit_code == 4


def test_errors_are_one_line_and_a_hint(runner: CliRunner, chain: Path) -> None:
    assert invoke(runner, "run", "chain", "--input", '{"fail": true}').exit_code == 1
    missing = invoke(runner, "runs", "show", "run_nope", "--agents", "chain")
    assert missing.exit_code == 5
    assert missing.stderr.splitlines()[0].startswith("error: no run with id 'run_nope'")
    assert missing.stderr.splitlines()[1].startswith("hint: ")
    assert "Traceback" not in missing.output

    unknown = invoke(runner, "run", "nobody", "--agents", "chain")
    assert unknown.exit_code == 5 and "unknown agent 'nobody'" in unknown.stderr

    (chain / "agent.yaml").write_text("name: chain\nmodel: nonsense\n")
    broken = invoke(runner, "run", "chain")
    assert broken.exit_code == 5
    assert "agent.yaml" in broken.stderr and "hint:" in broken.stderr

    no_dir = invoke(runner, "run", "./nowhere")
    assert no_dir.exit_code == 5 and "nowhere" in no_dir.stderr

    bad_json = invoke(runner, "run", "chain", "--input", "{nope")
    assert bad_json.exit_code == 2 and "not valid JSON" in bad_json.output

    exposed = invoke(runner, "serve", "--host", "0.0.0.0", "--agents", "chain")
    assert exposed.exit_code == 5 and "without an API token" in exposed.stderr


def test_a_corrupt_row_is_one_line_and_a_repair_hint(runner: CliRunner, chain: Path) -> None:
    assert invoke(runner, "run", "chain").exit_code == 0
    run_id = last_run_id(runner, chain)
    with contextlib.closing(sqlite3.connect(chain / ".toren" / "toren.db")) as db, db:
        db.execute("UPDATE runs SET output = '{broken' WHERE id = ?", (run_id,))
    shown = invoke(runner, "runs", "show", run_id, "--agents", "chain")
    assert shown.exit_code == 5 and "Traceback" not in shown.output
    first, hint = shown.stderr.splitlines()[:2]
    assert first.startswith(f"error: the output of runs row id={run_id!r} is not valid JSON")
    assert hint.startswith("hint: repair the row named above")


@pytest.mark.parametrize("run_id", ["[/x]", "[bold]run_x"])
def test_an_error_quoting_brackets_prints_them(runner: CliRunner, chain: Path, run_id: str) -> None:
    assert invoke(runner, "run", "chain").exit_code == 0  # a database, so the run is missing
    shown = invoke(runner, "runs", "show", run_id, "--agents", "chain")
    assert shown.exit_code == 5, shown.output
    assert shown.stderr.startswith(f"error: no run with id {run_id!r}")


def test_debug_shows_the_traceback(runner: CliRunner, chain: Path) -> None:
    with pytest.raises(RunNotFound):
        invoke(runner, "--debug", "runs", "show", "run_nope", "--agents", "chain")


def test_version(runner: CliRunner) -> None:
    import toren

    assert invoke(runner, "version").stdout.strip() == f"toren {toren.__version__}"
    assert invoke(runner, "--version").stdout.strip() == f"toren {toren.__version__}"
    deprecations = invoke(runner, "version", "--deprecations").stdout
    assert "system_prompt" in deprecations and "instructions" in deprecations


def test_colour_only_when_asked_or_on_a_tty_and_no_color_wins(
    runner: CliRunner, chain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert invoke(runner, "run", "chain", "--input", '{"fail": true}').exit_code == 1
    plain = invoke(runner, "runs", "list", "--agents", "chain").stdout
    assert "\x1b[" not in plain  # not a terminal: no escape codes
    forced = invoke(runner, "--color", "runs", "list", "--agents", "chain").stdout
    assert "\x1b[31m" in forced  # "failed" in red
    monkeypatch.setenv("NO_COLOR", "1")
    muted = invoke(runner, "--color", "runs", "list", "--agents", "chain").stdout
    assert "\x1b[31m" not in muted and "failed" in muted


# -- against a server (--url) -----------------------------------------------------------


@pytest.fixture
def server(chain: Path) -> Iterator[str]:
    from toren.api.app import create_app
    from toren.api.server import ThreadedServer
    from toren.config import Settings
    from toren.core.drivers.worker import LocalWorkerRuntime
    from toren.runtime import close_runtime, open_runtime, sqlite_url_for

    @contextlib.asynccontextmanager
    async def build() -> AsyncIterator[Any]:
        runtime = await open_runtime(chain, sqlite_url_for(chain), Settings())
        worker = LocalWorkerRuntime(runtime.deps)
        await worker.start()
        try:
            yield create_app(
                runtime.store,
                runtime.resolver,
                tokens=("s3cret-token-for-tests",),
                live=runtime.live,
                runtime=worker,
                console=False,
            )
        finally:
            await worker.stop(drain_window=0)
            await close_runtime(runtime)

    with ThreadedServer(build) as srv:
        yield srv.url


def test_remote_run_send_resume_and_inspect(
    runner: CliRunner, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOREN_API_URL", server)
    monkeypatch.setenv("TOREN_API_TOKEN", "s3cret-token-for-tests")
    result = invoke(runner, "run", "chain", "--input", '{"ask": true}')
    assert result.exit_code == 4, result.output
    assert "◆ model scripted:script.yaml" in result.stdout
    runs = json.loads(invoke(runner, "runs", "list", "--json").stdout)
    run_id = runs[0]["id"]
    assert runs[0]["status"] == "waiting"

    assert invoke(runner, "runs", "send", run_id, "approval", '"ok"').exit_code == 0
    resumed = invoke(runner, "runs", "resume", run_id)
    assert resumed.exit_code == 0, resumed.output
    assert "✔ completed" in resumed.stdout
    lines = invoke(runner, "runs", "events", run_id, "--json").stdout.splitlines()
    assert json.loads(lines[-1])["type"] == "RunCompleted"
    assert json.loads(invoke(runner, "runs", "show", run_id, "--json").stdout)["status"] == (
        "completed"
    )

    monkeypatch.delenv("TOREN_API_TOKEN")
    denied = invoke(runner, "runs", "list")
    assert denied.exit_code == 5 and "hint:" in denied.stderr and "token" in denied.stderr


def test_remote_unreachable(runner: CliRunner, chain: Path) -> None:
    result = invoke(runner, "runs", "list", "--url", "http://127.0.0.1:9")
    assert result.exit_code == 5
    assert "is the server running" in result.stderr


def test_chain_agent_fixture_is_intact() -> None:
    # The subprocess tests copy it; keep it runnable as shipped.
    assert (CHAIN / "agent.yaml").is_file() and shutil.which("python") is not None
    assert CliRunner().invoke(cli, ["--help"]).exit_code == 0


@pytest.mark.parametrize("command", ["worker", "serve", "dev"])
def test_an_unknown_log_level_is_a_usage_error(
    runner: CliRunner, chain: Path, command: str
) -> None:
    result = invoke(runner, command, "--log-level", "loud")
    assert result.exit_code == 2
    assert "'loud' is not one of" in result.output and "'warning'" in result.output


@pytest.mark.parametrize("name", ["", "bad\x01name", "n" * 256], ids=["empty", "control", "long"])
def test_send_refuses_the_message_names_the_api_refuses_in_its_words(
    runner: CliRunner, server: str, chain: Path, name: str
) -> None:
    import asyncio

    import httpx

    from toren.runtime import sqlite_url_for
    from toren.store import connect

    started = invoke(
        runner,
        "run",
        "chain",
        "--input",
        '{"ask": true}',
        "--url",
        server,
        "--token",
        "s3cret-token-for-tests",
    )
    assert started.exit_code == 4, started.output
    run_id = last_run_id(runner, chain)
    api = httpx.post(
        f"{server}/v1/runs/{run_id}/messages",
        json={"name": name, "payload": "x"},
        headers={"Authorization": "Bearer s3cret-token-for-tests"},
    )
    assert api.status_code == 422
    api_message = api.json()["error"]["message"]
    assert "is not a valid message name" in api_message

    for where in (["--agents", "chain"], ["--url", server, "--token", "s3cret-token-for-tests"]):
        sent = invoke(runner, "runs", "send", run_id, name, "x", *where)
        assert sent.exit_code == 2, (where, sent.output)
        said = sent.output.split("Error: ", 1)[1].strip()
        assert said.startswith("name: ") and "body." + said == api_message, (where, said)

    async def stored() -> object:
        store = await connect(sqlite_url_for(chain))
        try:
            return await store.next_message(run_id, [name])
        finally:
            await store.close()

    assert asyncio.run(stored()) is None  # nothing was sent


def _printed(pattern: str, text: str) -> list[str]:
    import re
    import shlex

    found = re.search(pattern, text, re.MULTILINE)
    assert found is not None, (pattern, text)
    words = shlex.split(found.group(1))
    assert words[0] == "toren"
    return words[1:]


@pytest.mark.parametrize("setup", ["agent-dir", "database-url"])
def test_printed_follow_ups_run_as_printed(
    runner: CliRunner, chain: Path, monkeypatch: pytest.MonkeyPatch, setup: str
) -> None:
    args = ["run", "./chain"]
    if setup == "database-url":  # from elsewhere, into a database of its own
        (chain.parent / "elsewhere").mkdir()
        monkeypatch.chdir(chain.parent / "elsewhere")
        db = chain.parent / "other.db"
        args = ["run", "../chain", "--database-url", f"sqlite:///{db}"]

    waiting = invoke(runner, *args, "--input", '{"ask": true}')
    assert waiting.exit_code == 4, waiting.output
    send = _printed(r"^\s*(toren runs send .*)$", waiting.stdout)
    resume = _printed(r"continue with (toren runs resume .*?) \(a running", waiting.stdout)
    sent = invoke(runner, *send)
    assert sent.exit_code == 0, (send, sent.output)
    assert _printed(r"continue it with (toren runs resume .*?) \(or let", sent.stdout) == resume
    resumed = invoke(runner, *resume)
    assert resumed.exit_code == 0, (resume, resumed.output)
    assert "✔ completed" in resumed.stdout and "your answer" in resumed.stdout

    detached = invoke(runner, *args, "--input", '{"ask": true}', "--detach")
    assert detached.exit_code == 0, detached.output
    later = _printed(r"run it here with (toren runs resume .*)$", detached.stderr)
    assert invoke(runner, *later).exit_code == 4


def test_a_follow_up_never_prints_a_password() -> None:
    from toren.cli._common import shown_url

    assert (
        shown_url("postgresql://toren:hunter2@db:5432/toren") == "postgresql://toren@db:5432/toren"
    )
    assert "hunter22" not in shown_url("postgresql://toren@db/toren?password=hunter22&x=1")
    assert "pa[ss" not in shown_url("postgresql://toren:pa[ss@db/toren")  # unparsable: no crash
    assert shown_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_runs_list_limit_is_the_apis_page_limit(
    runner: CliRunner, server: str, chain: Path
) -> None:
    import httpx

    from toren.core.drivers.runs import MAX_RUNS_PAGE

    auth = {"Authorization": "Bearer s3cret-token-for-tests"}
    api = httpx.get(f"{server}/v1/runs", params={"limit": MAX_RUNS_PAGE}, headers=auth)
    assert api.status_code == 200
    over = httpx.get(f"{server}/v1/runs", params={"limit": MAX_RUNS_PAGE + 1}, headers=auth)
    assert over.status_code == 422
    remote = ["--url", server, "--token", "s3cret-token-for-tests"]
    for where in (["--agents", "chain"], remote):
        ok = invoke(runner, "runs", "list", "--limit", str(MAX_RUNS_PAGE), "--json", *where)
        assert ok.exit_code == 0, (where, ok.output)
        bad = invoke(runner, "runs", "list", "--limit", str(MAX_RUNS_PAGE + 1), *where)
        assert bad.exit_code == 2, (where, bad.output)
        assert f"'--limit': {MAX_RUNS_PAGE + 1} is not in the range 1<=x<={MAX_RUNS_PAGE}" in (
            bad.output
        )


@contextlib.contextmanager
def _unprivileged(owned: Path) -> Iterator[None]:
    """Run the body as a user whom file modes bind (root ignores them): as root, as
    ``nobody`` (effective uid) with ``owned`` given to it; otherwise as oneself."""
    import os

    if os.geteuid() != 0:
        yield
        return
    nobody = 65534
    for path in [owned, *owned.rglob("*")]:
        os.chown(path, nobody, nobody)
    os.setegid(nobody)
    os.seteuid(nobody)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def test_init_force_that_fails_midway_changes_nothing(runner: CliRunner, tmp_path: Path) -> None:
    import os
    import stat
    import tempfile

    # Imports and the error path warmed up first: the unprivileged user may not read them.
    invoke(runner, "init", str(tmp_path / "warm"))
    assert invoke(runner, "init", str(tmp_path / "warm")).exit_code == 5

    # Outside tmp_path, whose parents only root may enter.
    project = Path(tempfile.mkdtemp(prefix="toren-init-"))
    try:
        assert invoke(runner, "init", str(project)).exit_code == 0
        for rel in ("agent.yaml", "tools.py", "README.md"):
            (project / rel).write_text(f"# mine: {rel}\n")
        before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
        os.chmod(project, 0o755)
        with _unprivileged(project):
            # agent.yaml comes first; prompts/system.md (and its directory) is read-only.
            os.chmod(project / "prompts" / "system.md", stat.S_IRUSR)
            os.chmod(project / "prompts", stat.S_IRUSR | stat.S_IXUSR)
            try:
                result = invoke(runner, "init", str(project), "--force")
            finally:
                os.chmod(project / "prompts", 0o755)
        after = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
        assert after == before
        assert result.exit_code == 5, result.output
        assert f"cannot write {project / 'prompts' / 'system.md'}" in result.stderr
        assert "nothing was changed" in result.stderr and "hint: check that" in result.stderr
        assert sorted(p.name for p in project.iterdir() if p.name.startswith(".toren")) == []
    finally:
        shutil.rmtree(project)


def test_init_force_never_replaces_a_directory(runner: CliRunner, tmp_path: Path) -> None:
    assert invoke(runner, "init", str(tmp_path)).exit_code == 0
    (tmp_path / "tools.py").write_text("# mine\n")
    (tmp_path / "compose.yaml").unlink()
    (tmp_path / "compose.yaml").mkdir()
    (tmp_path / "compose.yaml" / "keep.txt").write_text("mine\n")
    result = invoke(runner, "init", str(tmp_path), "--force")
    assert (tmp_path / "tools.py").read_text() == "# mine\n"
    assert result.exit_code == 5
    assert f"{tmp_path / 'compose.yaml'} is a directory" in result.stderr
    assert (tmp_path / "compose.yaml" / "keep.txt").read_text() == "mine\n"


READ_ONLY = [
    ["runs", "show", "run_nope"],
    ["runs", "events", "run_nope"],
    ["runs", "send", "run_nope", "approval", "yes"],
    ["runs", "cancel", "run_nope"],
    ["runs", "resume", "run_nope"],
]


@pytest.mark.parametrize("where", ["agents", "database-url"])
def test_reading_where_nothing_ran_says_so_and_creates_no_database(
    runner: CliRunner, chain: Path, where: str
) -> None:
    db = chain / ".toren" / "toren.db"
    options = ["--agents", "chain"]
    if where == "database-url":
        db = chain.parent / "elsewhere" / "runs.db"
        options += ["--database-url", f"sqlite:///{db}"]

    listed = invoke(runner, "runs", "list", *options)
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.strip() == f"no runs yet: there is no database at {db}"
    assert invoke(runner, "runs", "list", "--json", *options).stdout.strip() == "[]"
    planned = invoke(runner, "plan", "--fail-on-invalidation", *options)
    assert planned.exit_code == 0, planned.output
    assert f"no runs yet: there is no database at {db}" in planned.stderr
    assert "no runs in flight" in planned.stdout
    report = json.loads(invoke(runner, "plan", "--json", *options).stdout)
    assert (report["runs"], report["plans"]) == (0, [])
    for command in READ_ONLY:
        result = invoke(runner, *command, *options)
        assert result.exit_code == 5, (command, result.output)
        first, hint = result.stderr.splitlines()
        assert first == (
            f"error: there is no database at {db} yet: nothing has run with this agents "
            "directory (or --database-url); not creating one"
        )
        assert hint.startswith("hint: start a run first ('toren run DIR')")
    assert not (chain / ".toren").exists() and not db.parent.exists()


def _hint(result: Any) -> str:
    assert result.exit_code == 5, result.output
    return str(result.stderr.splitlines()[-1])


def test_hints_fit_the_error_on_the_embedded_database(runner: CliRunner, chain: Path) -> None:
    assert invoke(runner, "run", "chain", "--input", '{"fail": true}').exit_code == 1
    finished = last_run_id(runner, chain)

    missing = _hint(invoke(runner, "runs", "show", "run_nope", "--agents", "chain"))
    assert missing == "hint: list the runs there with 'toren runs list --agents chain'"
    assert invoke(runner, "runs", "list", "--agents", "chain").exit_code == 0
    assert _hint(invoke(runner, "run", "nobody", "--agents", "chain")) == (
        "hint: pass a path to an agent directory, or set --agents to the directory holding it"
    )
    assert _hint(invoke(runner, "run", "./chain", "--process", "nope")) == (
        "hint: pass --process with one of the processes named above"
    )
    sent = invoke(runner, "runs", "send", finished, "approval", "x", "--agents", "chain")
    assert f"error: run {finished!r} is failed; it takes no more messages" in sent.stderr
    assert _hint(sent) == (
        "hint: the run has ended and takes no more messages; start a new one with 'toren run'"
    )
    assert _hint(invoke(runner, "run", "./chain", "--idempotency-key", "")) == (
        "hint: see 'toren run --help' for the expected shape"
    )


def test_hints_fit_the_error_from_a_server(runner: CliRunner, server: str, chain: Path) -> None:
    remote = ["--url", server, "--token", "s3cret-token-for-tests"]
    failed = invoke(runner, "run", "chain", "--input", '{"fail": true}', *remote)
    assert failed.exit_code == 1, failed.output
    finished = json.loads(invoke(runner, "runs", "list", "--json", *remote).stdout)[0]["id"]

    assert _hint(invoke(runner, "runs", "show", "run_nope", *remote)) == (
        f"hint: list the server's runs with 'toren runs list --url {server}'"
    )
    assert _hint(invoke(runner, "run", "nobody", *remote)) == (
        "hint: the server runs the agents under its own --agents directory; check the name"
    )
    assert _hint(invoke(runner, "runs", "send", finished, "approval", "x", *remote)) == (
        "hint: the run has ended and takes no more messages; start a new one with 'toren run'"
    )


def test_a_refused_bind_gets_the_hint_of_its_cause(runner: CliRunner, chain: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = invoke(runner, "serve", "--port", str(port), "--agents", "chain")
    assert _hint(busy) == (
        f"hint: another process uses the port; pick another with --port (e.g. --port {port + 1})"
    )
    # 192.0.2.0/24 is reserved for documentation: never an address of this machine.
    elsewhere = invoke(runner, "serve", "--host", "192.0.2.1", "--token", "s3cret-token-for-tests")
    assert "cannot listen on 192.0.2.1:8000" in elsewhere.stderr
    assert _hint(elsewhere) == (
        "hint: the address is not one of this machine's; use --host 127.0.0.1 (or 0.0.0.0)"
    )


def test_run_refuses_an_agent_whose_model_has_no_key_before_creating_a_run(
    runner: CliRunner, chain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key for the agent's model: known when the agent loads, so refused like any
    configuration error (exit 5), naming the variable and the agent.yaml key; nothing is
    stored, and no run sits blocked from its first second."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    agent = chain.parent / "keyless"
    agent.mkdir()
    (agent / "agent.yaml").write_text("name: keyless\nmodel: openai:gpt-4o-mini\n")
    result = invoke(runner, "run", "keyless", "hello")
    assert result.exit_code == 5, result.output
    first, hint = result.stderr.splitlines()[-2:]
    assert first.startswith(
        "error: no OpenAI API key — set OPENAI_API_KEY or `api_key_env` "
        "(providers.openai.api_key_env) in agent.yaml"
    )
    assert "model 'openai:gpt-4o-mini' of agent 'keyless'" in first
    assert hint.startswith("hint: set the variable named above") and "nothing was started" in hint
    listed = invoke(runner, "runs", "list", "--agents", "keyless", "--json")
    assert json.loads(listed.stdout) == []


@pytest.mark.parametrize("debug", [False, True], ids=["line", "traceback"])
def test_log_lines_never_carry_a_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], debug: bool
) -> None:
    """An SDK's error can quote the key it was given; the log line (and, with --debug,
    the traceback) must not."""
    import logging

    from toren.cli import _common

    key = "sk-test-" + "k" * 32
    monkeypatch.setenv("ACME_API_KEY", key)
    toren_log = logging.getLogger("toren")  # setup_logging configures it: put it back after
    for attr in ("handlers", "propagate", "level"):
        monkeypatch.setattr(toren_log, attr, getattr(toren_log, attr))
    with click.Context(click.Command("toren"), obj=_common.State(debug=debug)):
        _common.setup_logging("info")
    try:
        raise RuntimeError(f"401 Unauthorized: bad key {key}")
    except RuntimeError:
        logging.getLogger("toren.test").exception("provider call failed for %s", key)
    logged = capsys.readouterr().err
    assert "provider call failed for [redacted]" in logged and "401 Unauthorized" in logged
    assert key not in logged
    assert ("Traceback" in logged) is debug


def test_a_name_that_is_also_a_directory_runs_where_the_rule_says(
    runner: CliRunner, chain: Path
) -> None:
    """From a folder holding ``chain/`` (issue 40 item 2): with ``--agents .`` the agents
    root wins (the run is in ./.toren, where ``toren dev`` of the folder looks); without
    it the directory is its own project, and a warning names the other database."""
    rooted = invoke(runner, "run", "chain", "--agents", ".")
    assert rooted.exit_code == 0, rooted.output
    assert "warning" not in rooted.stderr
    assert not (chain / ".toren").exists()
    listed = json.loads(invoke(runner, "runs", "list", "--agents", ".", "--json").stdout)
    assert [r["agent"] for r in listed] == ["chain"]

    own = invoke(runner, "run", "chain")
    assert own.exit_code == 0, own.output
    assert (chain / ".toren" / "toren.db").is_file()
    warning = " ".join(own.stderr.split())
    assert warning.startswith("warning: running the directory"), own.stderr
    assert str(chain / ".toren" / "toren.db") in warning
    assert "toren run chain --agents ." in warning
    assert len(json.loads(invoke(runner, "runs", "list", "--agents", ".", "--json").stdout)) == 1

    by_path = invoke(runner, "run", "./chain", "--agents", ".")  # a path to one of its agents
    assert by_path.exit_code == 0 and "warning" not in by_path.stderr
    assert len(json.loads(invoke(runner, "runs", "list", "--agents", ".", "--json").stdout)) == 2
    quiet = invoke(runner, "run", "./chain")  # a path: the directory, as asked, no warning
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr


def test_send_under_a_name_the_run_does_not_wait_for_warns_and_keeps_it(
    runner: CliRunner, chain: Path
) -> None:
    """Issue 40 item 4: the message is kept (exit 0) with a warning naming the names the
    run waits for; it does not wake the run."""
    assert invoke(runner, "run", "chain", "--input", '{"ask": true}').exit_code == 4
    run_id = last_run_id(runner, chain)
    typo = invoke(runner, "runs", "send", run_id, "aproval", "yes", "--agents", "chain")
    assert typo.exit_code == 0, typo.output
    warning = " ".join(typo.stderr.split())
    assert warning.startswith(f"warning: run {run_id!r} is waiting for 'approval', not 'aproval'")
    shown = json.loads(invoke(runner, "runs", "show", run_id, "--agents", "chain", "--json").stdout)
    assert shown["status"] == "waiting" and shown["waiting_for"] == ["approval"]
    right = invoke(runner, "runs", "send", run_id, "approval", "yes", "--agents", "chain")
    assert right.exit_code == 0 and "warning" not in right.stderr


def test_runs_help_says_which_subcommands_take_url_and_json() -> None:
    """Issue 40 item 9: `toren runs --help` claimed every subcommand takes --url and
    --json; each one that does not is named as an exception."""
    from toren.cli.main import cli

    group = cli.commands["runs"]  # type: ignore[attr-defined]
    text = " ".join(str(group.help).split())
    no_url = text.partition("(--url);")[2].partition("--json")[0]
    no_json = text.partition("--json for scripting")[2].partition(")")[0]
    for name, command in group.commands.items():
        options = {o for p in command.params for o in getattr(p, "opts", ())}
        assert (name in no_url.replace(",", " ").split()) == ("--url" not in options), name
        assert (name in no_json.replace(",", " ").split()) == ("--json" not in options), name
