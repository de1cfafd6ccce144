"""The Python example of docs/http-api.md, run as written against a real server that
serves ``examples/support-agent`` (issue 40 item 9): it names an agent that exists, and
its stream loop returns for a run that completes and for one that waits for a message."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import shutil
from pathlib import Path

import pytest

import toren
from toren.api import create_app
from toren.api.server import running_server
from toren.runtime import close_runtime, open_runtime

ROOT = Path(__file__).parents[2]
TOKEN = "s3cret-0123456789abcdef"  # the example's own token
ASKS_FIRST = """\
responses:
  - tool_calls:
      - {name: ask_human, arguments: {question: "Which order?"}}
default: {text: "done"}
"""


def example(url: str) -> str:
    """The first (sync) part of the "### Python" example, pointed at ``url``."""
    section = (ROOT / "docs" / "http-api.md").read_text().split("### Python", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    code = block.group(1).split("\nasync with", 1)[0]
    return code.replace("http://127.0.0.1:8000", url)


@pytest.mark.parametrize("asks", [False, True], ids=["completes", "waits"])
async def test_the_python_client_example_runs_as_written(
    db_url: str, tmp_path: Path, asks: bool
) -> None:
    agents = tmp_path / "agents"
    shutil.copytree(ROOT / "examples" / "support-agent", agents / "support-agent")
    if asks:
        (agents / "support-agent" / "script.yaml").write_text(ASKS_FIRST)
    runtime = await open_runtime(agents, db_url, toren.Settings(poll_interval=0.05))
    try:
        worker = toren.LocalWorkerRuntime(runtime.deps)
        app = create_app(runtime.store, runtime.resolver, runtime=worker, tokens=[TOKEN])
        async with worker, running_server(app) as server:
            printed = io.StringIO()

            def run_it() -> None:
                with contextlib.redirect_stdout(printed):
                    exec(compile(example(server.url), "http-api.md", "exec"), {})

            await asyncio.wait_for(asyncio.to_thread(run_it), 60)
    finally:
        await close_runtime(runtime)
    last = printed.getvalue().splitlines()[-1]
    if asks:
        assert last.startswith("waiting ['human']"), printed.getvalue()
    else:
        assert last.startswith("completed "), printed.getvalue()
