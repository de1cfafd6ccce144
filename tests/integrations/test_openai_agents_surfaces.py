"""An OpenAI Agents SDK agent through Toren's surfaces, unchanged (issue 36, deliver 2):
`toren runs retry` and `toren runs fork` from the CLI, and `toren dev` (a run through its
API, a reload that picks an edited agent up, and the console's run page showing the SDK
run's steps in headless Chromium), on SQLite and PostgreSQL. The SDK's real
OpenAIResponsesModel talks to the loopback server, which counts what it served.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.cli.conftest import free_port, invoke, sub_env, toren_exe
from tests.conftest import clone_pg_database, drop_pg_database, pg_url, require_pg
from tests.integrations.oa_agent import conversation, outbox_lines, turn_of, write_agent
from tests.providers.fakes import Failure, FakeModelServer, serve_fake_models

pytest.importorskip("agents")


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with serve_fake_models() as server:
        yield server


def toren(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``toren`` command as a user runs it: a process of its own (each command that
    runs the agent imports it afresh, its SDK client bound to that process's loop)."""
    return subprocess.run(
        [*toren_exe(), *args], env=sub_env(), capture_output=True, text=True, timeout=300
    )


def turns(fake: FakeModelServer) -> list[tuple[str, int]]:
    return [turn_of(r.body) for r in fake.responses.requests]


# -- retry and fork from the CLI -----------------------------------------------------------


@pytest.mark.slow  # real worker or dev processes, several of them
def test_cli_retry_and_fork_of_an_sdk_run_replay_the_handoff_and_the_tools(
    db_url: str, tmp_path: Path, fake: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """billing's first call is refused (HTTP 400): the run fails there. `toren runs
    retry` replays triage's calls, the lookup and the handoff from the log and sends only
    billing's calls; `toren runs fork --at main:4` starts a new run that replays the same
    prefix and runs billing live."""
    for variable in ("TOREN_DATABASE_URL", "TOREN_API_URL", "TOREN_AGENTS"):
        monkeypatch.delenv(variable, raising=False)
    outbox, agents = tmp_path / "outbox.jsonl", tmp_path / "agents"
    write_agent(agents, "responses", fake.openai_url, outbox)
    answer, refused = conversation(), []

    def reply(body: dict[str, Any]) -> Any:
        if turn_of(body) == ("billing", 2) and not refused:
            refused.append(body)
            return Failure(400, "the request was refused")
        return answer(body)

    fake.responses.responder = reply
    runner, where = CliRunner(), ("--agents", str(agents), "--database-url", db_url)

    ran = toren("run", "support", "Where is A-17?", *where)
    assert ran.returncode != 0 and "400" in ran.stdout, ran.stdout + ran.stderr
    listed = json.loads(invoke(runner, "runs", "list", *where, "--json").stdout)
    run_id = listed[0]["id"]
    assert listed[0]["status"] == "failed"
    assert turns(fake) == [("triage", 0), ("triage", 1), ("billing", 2)]

    retried = toren("runs", "retry", run_id, *where)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "✔ completed" in retried.stdout and "Emailed you about A-17." in retried.stdout
    # Only the refused call and what follows it went to the server again.
    assert turns(fake)[3:] == [("billing", 2), ("billing", 3)]
    assert [line["tool"] for line in outbox_lines(outbox)] == ["lookup_order", "send_email"]
    shown = json.loads(invoke(runner, "runs", "show", run_id, *where, "--json").stdout)
    assert shown["status"] == "completed" and shown["retries"] == 1

    forked = toren("runs", "fork", run_id, "--at", "main:4", *where)
    assert forked.returncode == 0, forked.stdout + forked.stderr
    assert "✔ completed" in forked.stdout
    # The fork replayed triage and the handoff (no triage request, no lookup) and ran
    # billing live from its first call.
    assert turns(fake)[5:] == [("billing", 2), ("billing", 3)]
    assert [line["tool"] for line in outbox_lines(outbox)] == [
        "lookup_order",
        "send_email",
        "send_email",  # the fork's own email: it runs live from main:4
    ]
    runs = json.loads(invoke(runner, "runs", "list", *where, "--json").stdout)
    fork = next(r for r in runs if r["id"] != run_id)
    lines = invoke(runner, "runs", "events", fork["id"], *where, "--json").stdout.splitlines()
    handoffs = [
        e["payload"]["result"]
        for e in map(json.loads, lines)
        if e["type"] == "ToolCallRecorded" and e["payload"]["name"] == "transfer_to_billing"
    ]
    assert handoffs == [{"agent": "billing"}]


# -- toren dev: the API, a reload, the console ----------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """None: `toren dev`'s own SQLite database; else a fresh PostgreSQL database URL."""
    if request.param == "sqlite":
        yield None
        return
    require_pg()
    name = clone_pg_database()
    try:
        yield pg_url(name)
    finally:
        drop_pg_database(name)


def read_until(dev: subprocess.Popen[str], text: str) -> str:
    out = ""
    assert dev.stdout is not None
    while text not in out:
        line = dev.stdout.readline()
        assert line, f"toren dev exited early:\n{out}"
        out += line
    return out


@pytest.mark.slow  # real worker or dev processes, several of them
async def test_toren_dev_runs_reloads_and_shows_an_sdk_agent(
    tmp_path: Path, fake: FakeModelServer, database: str | None
) -> None:
    from playwright.async_api import expect

    from tests.console.support import browser
    from toren.client import TorenClient

    outbox, agents = tmp_path / "outbox.jsonl", tmp_path / "agents"
    write_agent(agents, "responses", fake.openai_url, outbox)
    fake.responses.responder = conversation()
    port = free_port()
    args = [*toren_exe(), "dev", str(agents), "--port", str(port)]
    if database is not None:
        args += ["--database-url", database]
    dev = subprocess.Popen(
        args, env=sub_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        log = read_until(dev, "watching for changes")
        url = f"http://127.0.0.1:{port}"
        with TorenClient(url) as client:
            first = client.wait(client.start_run("support", "Where is A-17?").id, timeout=60)
            assert first.status == "completed", first.error
            assert first.output == "Emailed you about A-17."
            assert fake.responses.served == 4

            # The console's run page renders the SDK run: its seven steps, the handoff.
            async with browser() as chromium:
                page = await chromium.new_page()
                page.set_default_timeout(20_000)
                await page.goto(f"{url}/runs/{first.id}")
                steps = page.locator("li.step")
                await expect(steps).to_have_count(7)
                await expect(steps.locator(".name")).to_have_text(
                    [
                        "openai-responses:gpt-4.1",
                        "lookup_order",
                        "openai-responses:gpt-4.1",
                        "transfer_to_billing",
                        "openai-responses:gpt-4.1",
                        "send_email",
                        "openai-responses:gpt-4.1",
                    ]
                )
                await page.close()

            # An edit of the agent's code is picked up: the next run is billed by the
            # edited billing agent.
            app = agents / "support" / "app.py"
            app.write_text(app.read_text().replace("Email the customer", "Be brief. Email"))
            log += read_until(dev, "reloaded (")
            second = client.wait(client.start_run("support", "Where is A-17?").id, timeout=60)
            assert second.status == "completed", second.error
        billing = [r.body for r in fake.responses.requests[4:] if turn_of(r.body)[0] == "billing"]
        assert len(billing) == 2 and all("Be brief. Email" in json.dumps(b) for b in billing)
        assert second.code_version != first.code_version
    finally:
        dev.send_signal(signal.SIGINT)
        try:
            output, _ = dev.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            dev.kill()
            output, _ = dev.communicate()
    assert dev.returncode == 0, log + output
    assert "reloaded (support/app.py)" in log + output or "reloaded (app.py)" in log + output
