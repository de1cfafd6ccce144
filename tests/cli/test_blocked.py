"""A run blocked on an infrastructure error, as the CLI shows it: ``toren runs resume``
stops with the cause and the attempt, ``runs show`` and ``runs list`` say "blocked" with
the error and the next try, and the run completes once the key is back (SQLite and
PostgreSQL, through --database-url)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.cli.conftest import invoke
from tests.providers.fakes import (
    FAKE_KEY,
    Completion,
    FakeModelServer,
    FakeToolCall,
    serve_fake_models,
)

KEY_VAR = "TOREN_TEST_CLI_KEY"


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with serve_fake_models() as server:
        yield server


def test_a_blocked_run_shows_why_and_completes_once_the_key_is_back(
    runner: CliRunner,
    chain: Path,
    db_url: str,
    fake: FakeModelServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = chain.parent / "asker"
    agent.mkdir()
    (agent / "agent.yaml").write_text(
        "name: asker\nmodel: openai:gpt-4o-mini\ntools: [ask_human]\nproviders:\n"
        f"  openai: {{api_key_env: {KEY_VAR}, base_url: '{fake.openai_url}'}}\n"
    )
    where = ("--agents", "asker", "--database-url", db_url)
    fake.openai.script(
        Completion(tool_calls=(FakeToolCall("c1", "ask_human", {"question": "Which city?"}),)),
        Completion(text="Paris it is."),
    )
    monkeypatch.setenv(KEY_VAR, FAKE_KEY)
    started = invoke(runner, "run", "asker", "Plan my trip", "--database-url", db_url)
    assert started.exit_code == 4, started.output
    run_id = json.loads(invoke(runner, "runs", "list", *where, "--json").stdout)[0]["id"]

    monkeypatch.delenv(KEY_VAR)
    assert invoke(runner, "runs", "send", run_id, "human", '"Paris"', *where).exit_code == 0
    resumed = invoke(runner, "runs", "resume", run_id, *where)
    assert resumed.exit_code == 5, resumed.output
    error, hint = resumed.stderr.splitlines()[-2:]
    assert error == (
        f"error: no OpenAI API key: the environment variable {KEY_VAR} named by "
        "providers.openai.api_key_env in agent.yaml is not set"
    )
    assert "(blocked, attempt 1;" in hint and f"toren runs resume {run_id}" in hint
    assert fake.openai.served == 1

    shown = invoke(runner, "runs", "show", run_id, *where)
    assert re.search(r"blocked\s+blocked: no OpenAI API key", shown.stdout), shown.stdout
    assert re.search(r"attempts\s+1 since .*; next try \d\d:\d\d:\d\d", shown.stdout)
    row = json.loads(invoke(runner, "runs", "show", run_id, *where, "--json").stdout)
    assert row["status"] == "running" and row["blocked"]["attempts"] == 1
    assert row["blocked"]["error"]["code"] == "provider_unavailable"
    assert row["blocked"]["retry_at"] == row["not_before"]
    listed = invoke(runner, "runs", "list", *where)
    assert re.search(rf"{run_id}\s+asker\s+running blocked ×1", listed.stdout), listed.stdout

    monkeypatch.setenv(KEY_VAR, FAKE_KEY)
    done = invoke(runner, "runs", "resume", run_id, *where)
    assert done.exit_code == 0, done.output
    assert "Paris it is." in done.stdout
    # The steps recorded before are marked as replayed, not run again.
    assert re.search(r"model openai:gpt-4o-mini main/0 .*↺ replayed", done.stdout), done.stdout
    assert fake.openai.served == 2
    final = json.loads(invoke(runner, "runs", "show", run_id, *where, "--json").stdout)
    assert final["status"] == "completed" and final["blocked"] is None


ENTRY_AGENT = """\
async def main(ctx, input):
    reply = await ctx.model("openai:gpt-4o-mini", [{"role": "user", "content": str(input)}])
    return reply.text
"""


def test_an_entry_agent_without_its_key_stops_with_one_error_and_one_hint(
    runner: CliRunner, chain: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40 item 5: the model is chosen in code, so its provider is known only at the
    call. The command stops there: the error line, then the hint (no log line between),
    and the run is kept blocked, its next try said to be a worker's once due."""
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    agent = chain.parent / "coded"
    agent.mkdir()
    (agent / "agent.yaml").write_text("name: coded\nentry: agent:main\n")
    (agent / "agent.py").write_text(ENTRY_AGENT)
    started = invoke(runner, "run", "coded", "hi", "--database-url", db_url)
    assert started.exit_code == 5, started.output
    where = ("--agents", "coded", "--database-url", db_url)
    run_id = json.loads(invoke(runner, "runs", "list", *where, "--json").stdout)[0]["id"]
    error, hint = started.stderr.splitlines()
    assert error.startswith("error: no OpenAI API key — set OPENAI_API_KEY"), started.stderr
    assert hint.startswith(f"hint: run {run_id} is kept as it is (blocked, attempt 1;")
    assert "retries it by itself" in hint and f"toren runs resume {run_id}" in hint
    assert re.search(r"\d\d:\d\d:\d\d", hint) is None, "no clock time that is soon past"

    deadline = time.monotonic() + 30
    while True:  # the next try passes within seconds: then it is said to be a worker's
        shown = invoke(runner, "runs", "show", run_id, *where)
        if "(due: a 'toren worker' or 'toren dev' takes it)" in " ".join(shown.stdout.split()):
            break
        assert time.monotonic() < deadline, shown.stdout
        time.sleep(0.1)
    assert re.search(r"blocked\s+blocked: no OpenAI API key", shown.stdout), shown.stdout
