"""OpenAI Agents SDK agents on Toren (toren.integrations.openai_agents), driven through
the SDK's real OpenAIResponsesModel and OpenAIChatCompletionsModel against the loopback
wire server (tests/providers/fakes.py), on SQLite and PostgreSQL. What the server served
and what the side-effecting tools did is counted, never assumed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.integrations.oa_agent import conversation, outbox_lines, write_agent
from tests.providers.fakes import Completion, FakeEndpoint, FakeModelServer, serve_fake_models
from toren.runtime import Runtime, close_runtime, open_runtime

pytest.importorskip("agents")

APIS = ["responses", "chat"]


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with serve_fake_models() as server:
        yield server


def endpoint(fake: FakeModelServer, api: str) -> FakeEndpoint:
    return fake.responses if api == "responses" else fake.openai


async def opened(tmp_path: Path, db_url: str) -> Runtime:
    return await open_runtime(tmp_path / "agents", db_url, toren.Settings(poll_interval=0.05))


async def run_once(runtime: Runtime, input: Any = "Where is A-17?") -> Any:
    run = await toren.start_run(runtime.store, runtime.resolver, "support", input)
    async with toren.LocalWorkerRuntime(runtime.deps):
        return await toren.wait_for_run(runtime.store, run.id, timeout=30)


def steps(events: list[Any]) -> list[tuple[str, str]]:
    out = []
    for e in events:
        if e.type == "ModelCallRecorded":
            out.append(("model", e.payload.model))
        elif e.type == "ToolCallRecorded":
            out.append(("tool", e.payload.name))
    return out


@pytest.mark.parametrize("api", APIS)
async def test_an_unmodified_sdk_agent_runs_as_steps(
    db_url: str, tmp_path: Path, fake: FakeModelServer, api: str
) -> None:
    outbox = tmp_path / "outbox.jsonl"
    write_agent(tmp_path / "agents", api, fake.openai_url, outbox)
    server = endpoint(fake, api)
    server.responder = conversation()
    runtime = await opened(tmp_path, db_url)
    try:
        run = await toren.start_run(runtime.store, runtime.resolver, "support", "Where is A-17?")
        live = runtime.live.subscribe(run.id)  # before any worker runs it: no delta missed
        async with toren.LocalWorkerRuntime(runtime.deps):
            final = await toren.wait_for_run(runtime.store, run.id, timeout=30)
        assert final.status == "completed", final.error
        assert final.output == "Emailed you about A-17."
        events = await runtime.store.load_events(final.id)
        verified = await toren.verify_run(runtime.store, final.id)  # digests re-derived
        assert verified.ok, verified.to_dict()
    finally:
        await close_runtime(runtime)
    deltas = []
    while not live.empty():
        item = live.get_nowait()
        if item.get("type") == "delta":
            deltas.append((item["position"], item["text"]))
    # The last model call's text reached the live feed (SSE) in pieces, as streamed.
    assert "".join(text for pos, text in deltas if pos == 6) == "Emailed you about A-17."
    assert len([d for d in deltas if d[0] == 6]) > 1
    model = "gpt-4.1" if api == "responses" else "gpt-4o-mini"
    assert steps(events) == [
        ("model", model),
        ("tool", "lookup_order"),
        ("model", model),
        ("tool", "transfer_to_billing"),
        ("model", model),
        ("tool", "send_email"),
        ("model", model),
    ]
    assert server.served == 4
    assert [line["tool"] for line in outbox_lines(outbox)] == ["lookup_order", "send_email"]
    models = [e.payload for e in events if e.type == "ModelCallRecorded"]
    provider = "openai-responses" if api == "responses" else "openai"
    assert {m.provider for m in models} == {provider}
    assert final.input_tokens == 4 * 11 and final.output_tokens == 4 * 7
    assert final.cost_usd > 0  # priced as the same OpenAI model
    handoff = next(
        e.payload
        for e in events
        if e.type == "ToolCallRecorded" and e.payload.name == "transfer_to_billing"
    )
    assert handoff.result == {"agent": "billing"}


async def toren_plan(deps: Any, run_id: str) -> Any:
    from toren.core.drivers.plan import plan_run

    run = await deps.store.get_run(run_id)
    return await plan_run(deps, run)


@pytest.mark.parametrize("api", APIS)
async def test_approval_parks_survives_a_restart_and_an_edited_handoff_target(
    db_url: str, tmp_path: Path, fake: FakeModelServer, api: str
) -> None:
    """A tool that needs approval parks the run (waiting, for 'approval'); the worker
    that parked it is gone and a new one resumes it from the log. The billing agent's
    instructions are edited under the parked run: `toren plan` predicts the one
    invalidation at billing's first model call (position 4), the resumed run has exactly
    that StreamInvalidated, requests none of the triage steps again, takes the same
    handoff, and the approved refund and the email happen once."""
    outbox = tmp_path / "outbox.jsonl"
    agents = tmp_path / "agents"
    write_agent(agents, api, fake.openai_url, outbox)
    server = endpoint(fake, api)
    server.responder = conversation(refund=True)
    runtime = await opened(tmp_path, db_url)
    try:
        run = await toren.start_run(runtime.store, runtime.resolver, "support", "Refund A-17")
        async with toren.LocalWorkerRuntime(runtime.deps):
            parked = await toren.wait_for_run(runtime.store, run.id, timeout=30, until=("waiting",))
        assert parked.status == "waiting" and parked.waiting_for == ["approval"]
        assert server.served == 3
        assert [line["tool"] for line in outbox_lines(outbox)] == ["lookup_order"]

        write_agent(agents, api, fake.openai_url, outbox, billing="You are billing. Be brief.")
        deps = runtime.reload_deps()
        plan = await toren_plan(deps, run.id)
        assert [(f.stream, f.from_pos) for f in plan.findings] == [("main", 4)]

        await toren.send_message(runtime.store, run.id, "approval", True)
        async with toren.LocalWorkerRuntime(deps):
            final = await toren.wait_for_run(runtime.store, run.id, timeout=30)
        assert final.status == "completed", final.error
        assert final.output == "Emailed you about A-17."
        events = await runtime.store.load_events(run.id)
    finally:
        await close_runtime(runtime)
    invalidated = [e for e in events if e.type == "StreamInvalidated"]
    assert [(e.stream, e.payload.from_pos) for e in invalidated] == [("main", 4)]
    later = [r.body for r in server.requests[3:]]
    assert len(later) == 3 and all("Be brief." in str(b) for b in later)  # billing only
    handoffs = [
        e.payload.result
        for e in events
        if e.type == "ToolCallRecorded" and e.payload.name == "transfer_to_billing"
    ]
    assert handoffs == [{"agent": "billing"}]  # recorded once, replayed after the restart
    assert [line["tool"] for line in outbox_lines(outbox)] == [
        "lookup_order",
        "refund",
        "send_email",
    ]


# -- bad input ---------------------------------------------------------------------------


def write_entry(agents: Path, code: str) -> None:
    directory = agents / "support"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "app.py").write_text(code)
    (directory / "agent.yaml").write_text("name: support\nentry: app:agent\n")


async def refused(tmp_path: Path, db_url: str) -> str:
    """The error a start of the agent gets; and no run was created."""
    runtime = await opened(tmp_path, db_url)
    try:
        with pytest.raises(toren.AgentConfigError) as caught:
            await toren.start_run(runtime.store, runtime.resolver, "support", "hi")
        assert await runtime.store.list_runs() == []
    finally:
        await close_runtime(runtime)
    return str(caught.value)


async def test_a_wrong_sdk_object_is_refused_naming_what_is_expected(
    db_url: str, tmp_path: Path
) -> None:
    write_entry(tmp_path / "agents", "from agents import Runner\nagent = Runner()\n")
    message = await refused(tmp_path, db_url)
    assert "'app:agent', which is an object of type agents.run.Runner" in message
    assert "an OpenAI Agents SDK agents.Agent instance" in message


async def test_a_hosted_tool_is_refused_when_the_agent_loads(db_url: str, tmp_path: Path) -> None:
    write_entry(
        tmp_path / "agents",
        "from agents import Agent, WebSearchTool\n"
        "agent = Agent(name='a', model='gpt-4.1', tools=[WebSearchTool()])\n",
    )
    message = await refused(tmp_path, db_url)
    assert "WebSearchTool (a hosted tool" in message
    assert "function tools (@function_tool)" in message


async def test_the_sdk_missing_names_the_extra_to_install(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "agents", None)  # as if openai-agents were not installed
    write_entry(tmp_path / "agents", "from agents import Agent\nagent = Agent(name='a')\n")
    message = await refused(tmp_path, db_url)
    assert "which is not installed" in message
    assert "pip install 'toren-run[openai-agents]'" in message


async def test_input_that_is_not_a_prompt_fails_the_run_clearly(
    db_url: str, tmp_path: Path, fake: FakeModelServer
) -> None:
    write_agent(tmp_path / "agents", "responses", fake.openai_url, tmp_path / "outbox.jsonl")
    runtime = await opened(tmp_path, db_url)
    try:
        final = await run_once(runtime, input=[1, 2])
    finally:
        await close_runtime(runtime)
    assert final.status == "failed"
    assert "takes a text prompt; found list [1, 2]" in final.error["message"]
    assert fake.responses.served == 0


# -- the scaffold ------------------------------------------------------------------------


def test_the_openai_agents_scaffold_runs_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from tests.cli.conftest import invoke, last_run_id

    runner = CliRunner()
    monkeypatch.chdir(tmp_path)
    for variable in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)  # offline: no key, no server
    made = invoke(runner, "init", "weather", "--template", "openai-agents")
    assert made.exit_code == 0, made.output
    assert "entry: app:agent" in (tmp_path / "weather" / "agent.yaml").read_text()
    result = invoke(runner, "run", "weather", "What is the weather in Paris?")
    assert result.exit_code == 0, result.output
    assert "⚙ tool get_weather" in result.stdout
    assert "✔ completed" in result.stdout and "sunny in Paris" in result.stdout
    run_id = last_run_id(runner, tmp_path / "weather")
    shown = json.loads(
        invoke(runner, "runs", "show", run_id, "--agents", "weather", "--json").stdout
    )
    assert shown["status"] == "completed" and shown["usage"]["steps"] == 3
    # `toren runs verify` re-derives every digest from the log.
    verified = invoke(runner, "runs", "verify", run_id, "--agents", "weather")
    assert verified.exit_code == 0, verified.output


def test_an_unknown_template_is_refused(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from toren.cli.main import cli

    result = CliRunner().invoke(cli, ["init", str(tmp_path / "x"), "--template", "langchain"])
    assert result.exit_code == 2
    assert "'langchain' is not one of 'default', 'openai-agents'" in result.output
    assert not (tmp_path / "x").exists()


async def test_the_example_hands_off_and_emails_once(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    example = Path(__file__).parents[2] / "examples" / "openai-agents-support"
    shutil.copytree(example, tmp_path / "agents" / "support")
    outbox = tmp_path / "outbox.jsonl"
    monkeypatch.setenv("SUPPORT_AGENT_OUTBOX", str(outbox))
    runtime = await opened(tmp_path, db_url)
    try:
        run = await toren.start_run(
            runtime.store, runtime.resolver, "openai-agents-support", "Where is A-17?"
        )
        async with toren.LocalWorkerRuntime(runtime.deps):
            final = await toren.wait_for_run(runtime.store, run.id, timeout=30)
        events = await runtime.store.load_events(run.id)
    finally:
        await close_runtime(runtime)
    assert final.status == "completed", final.error
    assert "shipped with DHL" in final.output
    assert [t for kind, t in steps(events) if kind == "tool"] == [
        "lookup_order",
        "transfer_to_billing",
        "send_email",
    ]
    assert len(outbox.read_text().splitlines()) == 1


# -- budgets -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "served", "message"),
    [
        ("max_steps: 3", 2, "stopped at max_steps=3: 3 steps taken"),
        # The first call costs $0.000078 (11 in, 7 out at gpt-4.1's price): over budget.
        ("max_cost_usd: 0.00005", 1, "max_cost_usd"),
    ],
    ids=["max_steps", "max_cost_usd"],
)
async def test_agent_yaml_limits_stop_an_sdk_agent(
    db_url: str, tmp_path: Path, fake: FakeModelServer, limits: str, served: int, message: str
) -> None:
    directory = write_agent(tmp_path / "agents", "responses", fake.openai_url, tmp_path / "o")
    (directory / "agent.yaml").write_text(
        f"name: support\nentry: app:agent\nlimits: {{{limits}}}\n"
    )
    fake.responses.responder = conversation()
    runtime = await opened(tmp_path, db_url)
    try:
        final = await run_once(runtime)
    finally:
        await close_runtime(runtime)
    assert final.status == "failed"
    assert final.error["code"] == "limit_exceeded", final.error
    assert message in final.error["message"]
    assert fake.responses.served == served


# -- guardrails ----------------------------------------------------------------------------

GUARDED = """
from agents import GuardrailFunctionOutput, RunConfig, Runner, input_guardrail

guard = Agent(name="guard", instructions="You are a guard. Answer ok or stop.", model=model)


@input_guardrail
async def screen(context, agent, input):
    verdict = await Runner.run(guard, input, run_config=RunConfig(tracing_disabled=True))
    _did("guardrail", verdict=verdict.final_output)
    return GuardrailFunctionOutput(
        output_info={"verdict": verdict.final_output},
        tripwire_triggered=verdict.final_output == "stop",
    )


agent = agent.clone(input_guardrails=[screen])
"""


def guarded(verdict: str) -> Any:
    rest = conversation(refund=True)

    def reply(body: dict[str, Any]) -> Any:
        if "You are a guard" in json.dumps(body):
            return Completion(text=verdict)
        return rest(body)

    return reply


async def test_a_guardrail_that_calls_a_model_is_a_step_not_repeated_on_resume(
    db_url: str, tmp_path: Path, fake: FakeModelServer
) -> None:
    outbox = tmp_path / "outbox.jsonl"
    directory = write_agent(tmp_path / "agents", "responses", fake.openai_url, outbox)
    (directory / "app.py").write_text((directory / "app.py").read_text() + GUARDED)
    fake.responses.responder = guarded("ok")
    runtime = await opened(tmp_path, db_url)
    try:
        run = await toren.start_run(runtime.store, runtime.resolver, "support", "Refund A-17")
        async with toren.LocalWorkerRuntime(runtime.deps):
            parked = await toren.wait_for_run(runtime.store, run.id, timeout=30, until=("waiting",))
        assert parked.status == "waiting"
        await toren.send_message(runtime.store, run.id, "approval", True)
        async with toren.LocalWorkerRuntime(runtime.deps):  # a new worker replays it all
            final = await toren.wait_for_run(runtime.store, run.id, timeout=30)
        events = await runtime.store.load_events(run.id)
    finally:
        await close_runtime(runtime)
    assert final.status == "completed", final.error
    guard_requests = [r for r in fake.responses.requests if "You are a guard" in json.dumps(r.body)]
    assert len(guard_requests) == 1  # the guardrail's model call: once, not on the resume
    assert [line["tool"] for line in outbox_lines(outbox)] == [
        "guardrail",
        "lookup_order",
        "refund",
        "send_email",
    ]
    first = steps(events)[0]
    assert first == ("tool", "guardrail:screen")  # before the agent's first model call
    verdict = next(e.payload for e in events if e.type == "ToolCallRecorded")
    assert verdict.result == {"tripwire_triggered": False, "output_info": {"verdict": "ok"}}


async def test_a_tripped_guardrail_fails_the_run_before_the_agent_pays(
    db_url: str, tmp_path: Path, fake: FakeModelServer
) -> None:
    outbox = tmp_path / "outbox.jsonl"
    directory = write_agent(tmp_path / "agents", "responses", fake.openai_url, outbox)
    (directory / "app.py").write_text((directory / "app.py").read_text() + GUARDED)
    fake.responses.responder = guarded("stop")
    runtime = await opened(tmp_path, db_url)
    try:
        final = await run_once(runtime)
    finally:
        await close_runtime(runtime)
    assert final.status == "failed"
    assert "InputGuardrailTripwireTriggered" in final.error["message"] + final.error["type"]
    assert fake.responses.served == 1  # the guard's call only: triage never asked


# -- fork and retry ------------------------------------------------------------------------


async def test_a_fork_replays_the_handoff_and_the_tools_from_the_log(
    db_url: str, tmp_path: Path, fake: FakeModelServer
) -> None:
    """A fork of a finished run past its last step answers every step from the log: the
    same output, the same handoff, nothing requested or executed again."""
    outbox = tmp_path / "outbox.jsonl"
    write_agent(tmp_path / "agents", "responses", fake.openai_url, outbox)
    fake.responses.responder = conversation()
    runtime = await opened(tmp_path, db_url)
    try:
        live = await run_once(runtime)
        assert live.status == "completed", live.error
        forked = await toren.fork_run(runtime.store, runtime.resolver, live.id, at="main:7")
        async with toren.LocalWorkerRuntime(runtime.deps):
            replayed = await toren.wait_for_run(runtime.store, forked.id, timeout=30)
    finally:
        await close_runtime(runtime)
    assert replayed.status == "completed", replayed.error
    assert replayed.output == live.output
    assert fake.responses.served == 4  # the live run's four calls, none for the fork
    assert [line["tool"] for line in outbox_lines(outbox)] == ["lookup_order", "send_email"]
    assert (replayed.input_tokens, replayed.cost_usd) == (live.input_tokens, live.cost_usd)
