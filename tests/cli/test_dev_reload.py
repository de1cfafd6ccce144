"""`toren dev` reloads without re-paying (issue 20's must-show), on SQLite and PostgreSQL.

`toren dev` runs as a real process against a loopback OpenAI-wire server that takes 2 s
per request and counts every request and the usage it served. An agent with four model
steps (step k sends the text of prompts/step{k}.md, read at run time) is started; README.md
is edited while step 1 is at the server, then prompts/step1.md while step 2 is. Counted:

- the README edit changes nothing: no reload, the same code version;
- the prompt edit reloads once: step 2, in flight, finishes and is recorded under the old
  version (the drain a deploy gets), then the run continues under the new code, which
  honestly invalidates from step 1 and re-runs steps 1-3 with the new prompt;
- no request body is ever sent twice (0 identical requests re-sent);
- the run's tokens and cost equal the sum of the usage the server served, priced.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import free_port, sub_env, toren_exe
from tests.cli.test_processes import wait_until
from tests.conftest import create_pg_database, drop_pg_database, pg_url, require_pg
from tests.providers.fakes import FAKE_KEY, Completion, FakeModelServer, serve_fake_models
from toren.agents.pricing import default_table
from toren.providers.base import Usage

pytestmark = pytest.mark.slow

MODEL = "openai:gpt-4o-mini"
SECONDS_PER_REQUEST = 2.0

AGENT_YAML = """\
name: slowchain
description: Four model steps; step k sends prompts/step{k}.md, read at run time.
model: openai:gpt-4o-mini
entry: agent:main
"""

AGENT_PY = """\
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


async def main(ctx: Any, input: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for k in range(4):
        # Read at run time: a prompt edit is seen by the next tick, and the prompt files
        # are part of the code version.
        prompt = (HERE / "prompts" / f"step{k}.md").read_text(encoding="utf-8").strip()
        messages.append({"role": "user", "content": f"step {k}: {prompt}"})
        reply = await ctx.model("openai:gpt-4o-mini", messages)
        messages.append(reply.message())
    return {"answer": reply.text}
"""


@dataclass
class Served:
    """What the loopback model server received and answered: every request body's digest,
    the step it was for, and the usage it served."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    digests: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    usage: list[Usage] = field(default_factory=list)

    def reply(self, body: dict[str, Any]) -> Completion:
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        with self.lock:
            n = len(self.digests)
            # Distinct usage per request, so a call counted twice or lost shows in the sum.
            usage = Usage(input_tokens=1000 * (n + 1) + 7, output_tokens=10 * (n + 1) + 3)
            self.digests.append(digest)
            self.steps.append(str(body["messages"][-1]["content"]))
            self.usage.append(usage)
        return Completion(
            text=f"answer {n}",
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            delay=SECONDS_PER_REQUEST,
        )

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.digests)


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """None: `toren dev`'s own SQLite database; else a fresh PostgreSQL database URL."""
    if request.param == "sqlite":
        yield None
        return
    require_pg()
    name = create_pg_database("toren_d_devreload")
    try:
        yield pg_url(name)
    finally:
        drop_pg_database(name)


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with serve_fake_models() as server:
        yield server


def _agent(root: Path) -> Path:
    (root / "prompts").mkdir(parents=True)
    (root / "agent.yaml").write_text(AGENT_YAML)
    (root / "agent.py").write_text(AGENT_PY)
    (root / "README.md").write_text("# slowchain\n\nFour slow steps.\n")
    for k in range(4):
        (root / "prompts" / f"step{k}.md").write_text(f"Say {k}, politely.\n")
    return root


def _start_dev(
    root: Path, fake: FakeModelServer, database: str | None, port: int
) -> subprocess.Popen[str]:
    args = [*toren_exe(), "dev", str(root), "--port", str(port), "--no-console"]
    if database is not None:
        args += ["--database-url", database]
    env = sub_env(OPENAI_API_KEY=FAKE_KEY, OPENAI_BASE_URL=fake.openai_url)
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _banner(dev: subprocess.Popen[str]) -> str:
    banner = ""
    assert dev.stdout is not None
    while "watching for changes" not in banner:
        line = dev.stdout.readline()
        assert line, f"toren dev exited early:\n{banner}"
        banner += line
    return banner


def test_dev_reload_resends_nothing_and_counts_every_call(
    tmp_path: Path,
    fake: FakeModelServer,
    database: str | None,
    procs: list[subprocess.Popen[str]],
) -> None:
    from toren.client import TorenClient

    root = _agent(tmp_path / "slowchain")
    served = Served()
    fake.openai.responder = served.reply
    port = free_port()
    dev = _start_dev(root, fake, database, port)
    procs.append(dev)
    banner = _banner(dev)
    url = f"http://127.0.0.1:{port}"

    with TorenClient(url) as client:
        run = client.start_run("slowchain", {})

        def recorded() -> list[Any]:
            return [e for e in client.events(run.id).events if e.type == "ModelCallRecorded"]

        # README.md while step 1 is at the server (sent, not answered nor recorded).
        wait_until(lambda: served.count == 2, 30, "step 1 at the model server")
        (root / "README.md").write_text("# slowchain\n\nEdited while step 1 is in flight.\n")
        assert len(recorded()) == 1, "step 1 was no longer in flight when README.md changed"

        # prompts/step1.md while step 2 is at the server.
        wait_until(lambda: served.count == 3, 30, "step 2 at the model server")
        (root / "prompts" / "step1.md").write_text("Say 1, briefly (v2).\n")
        assert len(recorded()) == 2, "step 2 was no longer in flight when the prompt changed"

        done = client.wait(run.id, timeout=90)
        assert done.status == "completed", done.error
        events = client.events(run.id, limit=500).events

    dev.send_signal(signal.SIGINT)
    output, _ = dev.communicate(timeout=60)
    assert dev.returncode == 0, output
    log = banner + output

    # The README edit was no reload; the prompt edit exactly one, naming the prompt.
    assert log.count("reloaded (") == 1, log
    assert "reloaded (prompts/step1.md)" in log, log

    calls = [e for e in events if e.type == "ModelCallRecorded"]
    first = calls[0].code_version
    # Steps 0-2 under the version the run started with (step 1 answered after the README
    # edit: the same version), step 2 drained into the log under it; then the new code.
    assert [(c.position, c.code_version == first) for c in calls] == [
        (0, True),
        (1, True),
        (2, True),
        (1, False),
        (2, False),
        (3, False),
    ]
    assert done.code_version == calls[-1].code_version != first
    invalidations = [e for e in events if e.type == "StreamInvalidated"]
    assert [(i.payload["from_pos"], i.payload["cause"]) for i in invalidations] == [
        (1, "digest_mismatch")
    ]
    assert not [e for e in events if e.type == "ModelCallCutOff"]  # nothing was cut off

    # Counted at the server: six requests, each body once (0 identical re-sent). Steps 1
    # and 2 went twice only because step 1's prompt changed: different bodies.
    assert served.steps == [
        "step 0: Say 0, politely.",
        "step 1: Say 1, politely.",
        "step 2: Say 2, politely.",
        "step 1: Say 1, briefly (v2).",
        "step 2: Say 2, politely.",
        "step 3: Say 3, politely.",
    ]
    resent = sum(n - 1 for n in Counter(served.digests).values())
    assert resent == 0
    assert len({c.digest for c in calls}) == 6  # six recorded calls, six digests

    # The run's totals are the usage the server served, priced.
    prices = default_table()
    cost = sum((prices.cost(MODEL, u) for u in served.usage), Decimal(0))
    assert done.usage.input_tokens == sum(u.input_tokens for u in served.usage)
    assert done.usage.output_tokens == sum(u.output_tokens for u in served.usage)
    assert done.usage.cost_usd == cost
    assert done.usage.steps == 6
    print(
        f"\n[{'sqlite' if database is None else 'postgres'}] requests {served.count}, "
        f"identical re-sent {resent}, served {sum(u.input_tokens for u in served.usage)} in / "
        f"{sum(u.output_tokens for u in served.usage)} out = ${cost}; run cost "
        f"${done.usage.cost_usd}, steps {done.usage.steps}"
    )
