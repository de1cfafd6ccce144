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
from tests.conftest import clone_pg_database, drop_pg_database, pg_url, require_pg
from tests.providers.fakes import (
    FAKE_KEY,
    Completion,
    FakeModelServer,
    render_anthropic,
    serve_fake_models,
)
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
    name = clone_pg_database("toren_d_devreload")
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


# -- a call cut off past the drain window ------------------------------------------------

ANTHROPIC_MODEL = "anthropic:claude-sonnet-4-5"
PACE = 0.2  # seconds before each streamed event: a reply streams for about 5 s


@dataclass
class Streamed:
    """An Anthropic-wire server whose replies stream slowly, and what it served: per
    request, its body's digest and the usage of the last usage-bearing event it sent
    (``message_start``: the input and 1 output token; ``message_delta``: the output), so a
    stream cut off mid-answer counts exactly what the client could have read."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    digests: list[str] = field(default_factory=list)
    served: list[Usage] = field(default_factory=list)
    pulled: list[int] = field(default_factory=list)  # events handed to the server so far

    def reply(self, body: dict[str, Any]) -> Completion:
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        with self.lock:
            n = len(self.digests)
            self.digests.append(digest)
            self.served.append(Usage())
            self.pulled.append(0)
        return Completion(
            text=f"answer {n:02d}".ljust(20, "."),
            chunk_size=1,
            input_tokens=1000 * (n + 1) + 7,
            output_tokens=10 * (n + 1) + 3,
            pace=PACE,
        )

    def render(self, reply: Completion, request: dict[str, Any]) -> Any:
        response = render_anthropic(reply, request)
        n = int(reply.text.split()[1][:2])
        response._events = self._track(n, reply, response._events)
        return response

    def _track(self, n: int, reply: Completion, events: Iterator[str]) -> Iterator[str]:
        # Event i has been sent once event i+1 is asked for (or the stream has ended).
        pending: Usage | None = None
        for event in events:
            with self.lock:
                if pending is not None:
                    self.served[n] = pending
                self.pulled[n] += 1
            pending = None
            if event.startswith("event: message_start"):
                pending = Usage(reply.input_tokens, 1)
            elif event.startswith("event: message_delta"):
                pending = Usage(reply.input_tokens, reply.output_tokens)
            yield event
        with self.lock:
            if pending is not None:
                self.served[n] = pending

    def streaming(self, n: int) -> bool:
        """Request ``n`` has sent its first text delta (so its message_start too)."""
        with self.lock:
            return len(self.pulled) > n and self.pulled[n] >= 5


def test_dev_reload_counts_a_call_cut_off_past_the_drain_window(
    tmp_path: Path,
    fake: FakeModelServer,
    database: str | None,
    procs: list[subprocess.Popen[str]],
) -> None:
    """With a drain window shorter than the call (0.5 s against ~5 s), a reload cuts the
    call in flight off. It runs again (at-least-once for that one step: its identical
    request is the only one sent twice), and both calls are in the run's cost: the cut one
    with the usage its stream had reported (message_start), recorded as ModelCallCutOff."""
    from toren.client import TorenClient

    root = _agent(tmp_path / "slowchain")
    (root / "agent.yaml").write_text(AGENT_YAML.replace(MODEL, ANTHROPIC_MODEL))
    (root / "agent.py").write_text(AGENT_PY.replace(MODEL, ANTHROPIC_MODEL).replace("4)", "3)"))
    streamed = Streamed()
    fake.anthropic.responder = streamed.reply
    fake.anthropic.render = streamed.render
    port = free_port()
    args = [*toren_exe(), "dev", str(root), "--port", str(port), "--no-console"]
    if database is not None:
        args += ["--database-url", database]
    env = sub_env(
        ANTHROPIC_API_KEY=FAKE_KEY, ANTHROPIC_BASE_URL=fake.anthropic_url, TOREN_DRAIN_WINDOW="0.5"
    )
    dev = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    procs.append(dev)
    banner = _banner(dev)

    with TorenClient(f"http://127.0.0.1:{port}") as client:
        run = client.start_run("slowchain", {})
        # Step 1 is streaming: edit the prompt of step 2 (a later step), a new version.
        wait_until(lambda: streamed.streaming(1), 60, "step 1 streaming")
        (root / "prompts" / "step2.md").write_text("Say 2, briefly (v2).\n")
        done = client.wait(run.id, timeout=120)
        assert done.status == "completed", done.error
        events = client.events(run.id, limit=500).events

    dev.send_signal(signal.SIGINT)
    output, _ = dev.communicate(timeout=60)
    assert dev.returncode == 0, output
    assert (banner + output).count("reloaded (prompts/step2.md)") == 1, banner + output

    [cut] = [e for e in events if e.type == "ModelCallCutOff"]
    assert (cut.payload["stream"], cut.payload["position"]) == ("main", 1)
    assert (cut.payload["input_tokens"], cut.payload["output_tokens"]) == (2007, 1)
    calls = [e for e in events if e.type == "ModelCallRecorded"]
    assert [c.position for c in calls] == [0, 1, 2]
    assert cut.payload["request_digest"] == calls[1].digest  # the same request, sent again

    # Counted at the server: 4 requests, the cut-off one sent twice (the only repeat).
    with streamed.lock:
        digests, served = list(streamed.digests), list(streamed.served)
    assert len(digests) == 4 and digests[1] == digests[2]
    resent = sum(n - 1 for n in Counter(digests).values())
    assert resent == 1
    assert served[1] == Usage(2007, 1)  # cut after message_start, before message_delta

    prices = default_table()
    cost = sum((prices.cost(ANTHROPIC_MODEL, u) for u in served), Decimal(0))
    assert done.usage.input_tokens == sum(u.input_tokens for u in served)
    assert done.usage.output_tokens == sum(u.output_tokens for u in served)
    assert done.usage.cost_usd == cost
    assert done.usage.steps == 3
    print(
        f"\n[{'sqlite' if database is None else 'postgres'}] cut off past the drain window: "
        f"requests {len(digests)}, identical re-sent {resent} (the cut-off call), served "
        f"{sum(u.input_tokens for u in served)} in / {sum(u.output_tokens for u in served)} "
        f"out = ${cost}; run cost ${done.usage.cost_usd}"
    )
