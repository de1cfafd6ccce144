"""``toren run AGENT`` without --url: one object (:class:`toren.cli.session.LocalSession`)
opens the runtime, starts the run, follows it on a worker of its own and closes, on SQLite
and PostgreSQL (issue 33 item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toren.cli._common import EXIT_OK
from toren.cli.project import scaffold
from toren.cli.session import LocalSession
from toren.core.contract.values import RunStatus
from toren.errors import MissingProviderKey


async def test_open_start_follow_close(
    tmp_path: Path, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "hello"
    scaffold(root, name="hello")
    async with await LocalSession.open(root, database_url=db_url, code_version="v1") as session:
        run = await session.start(None, "What is the weather in Lyon?")  # the root's agent
        assert run.agent == "hello" and not run.terminal
        assert await session.follow(run.id) == EXIT_OK
        assert session.backend.worker is not None  # its own worker, for this run only
        done = await session.backend.get_run(run.id)
        assert done.status == RunStatus.COMPLETED
        events = await session.backend.events(run.id)
        assert {e["code_version"] for e in events if e["type"] == "ModelCallRecorded"} == {"v1"}
    assert session.backend.worker is None  # drained and given back
    await session.close()  # a second close does nothing
    assert "✔ completed" in capsys.readouterr().out


async def test_a_run_that_could_never_start_is_refused_before_it_exists(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    root = tmp_path / "hello"
    scaffold(root, name="hello")
    yaml = (root / "agent.yaml").read_text()
    (root / "agent.yaml").write_text(
        yaml.replace("model: scripted:script.yaml", "model: openai:gpt-4o-mini")
    )
    async with await LocalSession.open(root, database_url=db_url, code_version=None) as session:
        with pytest.raises(MissingProviderKey):
            await session.start("hello", "hi")
        assert await session.backend.list_runs(status=None, agent=None, limit=10) == []
