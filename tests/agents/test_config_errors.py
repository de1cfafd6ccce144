"""Thirty-odd malformed agent directories, each with the clear message it must produce.

Every message names the file, the key path, what was found and what is expected; none is
a traceback or a raw pydantic dump.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from toren.agents import load_agent
from toren.errors import AgentConfigError

GOOD_TOOLS = '''
def lookup_order(order_id: str) -> dict:
    """Look up an order."""
    return {"order_id": order_id}
'''


@dataclass(frozen=True)
class Case:
    id: str
    yaml: str
    expect: tuple[str, ...]  # substrings of the message, in addition to the file path
    files: dict[str, str] = field(default_factory=dict)
    file: str = "agent.yaml"  # the file the message must name


CASES = [
    Case(
        "schedule-bad-cron",
        "name: a\nmodel: openai:gpt-4o\nschedules:\n  - name: nightly\n    cron: '0 25 * * *'\n",
        (":5:", "at 'schedules[0].cron'", "not a valid cron expression", "expected"),
    ),
    Case(
        "schedule-unknown-zone",
        "name: a\nmodel: openai:gpt-4o\nschedules:\n  - name: nightly\n"
        "    cron: '0 2 * * *'\n    zone: Europe/Lyon\n",
        (":6:", "at 'schedules[0].zone'", "IANA time zone", "'Europe/Lyon'"),
    ),
    Case(
        "schedule-nonsense-interval",
        "name: a\nmodel: openai:gpt-4o\nschedules:\n  - name: often\n    every: 0.2s\n",
        (":5:", "at 'schedules[0].every'", "whole seconds"),
    ),
    Case(
        "schedule-unknown-process",
        "name: a\nmodel: openai:gpt-4o\nschedules:\n  - name: n\n    every: 1h\n"
        "    process: nightly\n",
        ("schedules", "'nightly'", "is not declared"),
    ),
    Case(
        "yaml-syntax",
        "name: a\nmodel: [openai:gpt-4o\n",
        ("found invalid YAML", "line 3", "expected a YAML mapping"),
    ),
    Case(
        "yaml-bad-indent",
        "name: a\n  model: openai:gpt-4o\n",
        ("found invalid YAML", "line 2", "check indentation"),
    ),
    Case("empty-file", "", ("found an empty file", "expected a mapping")),
    Case("top-level-list", "- name: a\n", ("at the top level", "(list)", "expected a mapping")),
    Case("top-level-scalar", "hello\n", ("'hello' (string)", "expected a mapping")),
    Case(
        "duplicate-key",
        "name: a\nmodel: openai:gpt-4o\nname: b\n",
        (":3:", "at 'name'", "second time (first on line 1)", "each key at most once"),
    ),
    Case(
        "missing-name",
        "model: openai:gpt-4o\n",
        ("at 'name'", "found nothing (the key is missing)", "expected the required key 'name'"),
    ),
    Case(
        "name-wrong-type",
        "name: [a, b]\nmodel: openai:gpt-4o\n",
        (":1:", "at 'name'", "found ['a', 'b'] (list)", "expected a string"),
    ),
    Case(
        "name-bad-characters",
        "name: 'my agent!'\nmodel: openai:gpt-4o\n",
        ("at 'name'", "found 'my agent!' (string)", "expected a name of letters, digits"),
    ),
    Case(
        "unknown-top-level-key",
        "name: a\nmodle: openai:gpt-4o\n",
        (":2:", "at 'modle'", "found unknown key 'modle'", "did you mean 'model'?"),
    ),
    Case(
        "unknown-limits-key",
        "name: a\nmodel: openai:gpt-4o\nlimits:\n  max_step: 3\n",
        (":4:", "at 'limits.max_step'", "unknown key", "did you mean 'max_steps'?"),
    ),
    Case(
        "max-steps-negative",
        "name: a\nmodel: openai:gpt-4o\nlimits: {max_steps: -3}\n",
        ("at 'limits.max_steps'", "found -3 (integer)", "expected a number >= 1"),
    ),
    Case(
        "max-steps-not-a-number",
        "name: a\nmodel: openai:gpt-4o\nlimits: {max_steps: ten}\n",
        ("at 'limits.max_steps'", "found 'ten' (string)", "expected an integer"),
    ),
    Case(
        "max-cost-zero",
        "name: a\nmodel: openai:gpt-4o\nlimits: {max_cost_usd: 0}\n",
        ("at 'limits.max_cost_usd'", "found 0 (integer)", "expected a number > 0"),
    ),
    Case(
        "limits-not-a-mapping",
        "name: a\nmodel: openai:gpt-4o\nlimits: 5\n",
        ("at 'limits'", "found 5 (integer)", "expected a mapping"),
    ),
    Case(
        "model-without-provider",
        "name: a\nmodel: gpt-4o\n",
        ("at 'model'", "found 'gpt-4o'", "'provider:model'"),
    ),
    Case(
        "model-unknown-provider",
        "name: a\nmodel: opneai:gpt-4o\n",
        ("at 'model'", "found the provider 'opneai'", "declared under 'providers:'"),
    ),
    Case(
        "scripted-file-missing",
        "name: a\nmodel: scripted:missing.yaml\n",
        ("at 'model'", "no file 'missing.yaml'", "'scripted:<file>'"),
    ),
    Case(
        "no-model-no-entry",
        "name: a\n",
        ("at 'model'", "found nothing", "required unless the process names an 'entry:'"),
    ),
    Case(
        "instructions-and-file",
        "name: a\nmodel: openai:gpt-4o\ninstructions: hi\ninstructions_file: p.md\n",
        ("found", "expected", "either 'instructions' or 'instructions_file', not both"),
        files={"p.md": "hi"},
    ),
    Case(
        "instructions-file-missing",
        "name: a\nmodel: openai:gpt-4o\ninstructions_file: prompts/system.md\n",
        (":3:", "at 'instructions_file'", "'prompts/system.md' (no such file", "UTF-8 text file"),
    ),
    Case(
        "tools-not-a-list",
        "name: a\nmodel: openai:gpt-4o\ntools: lookup_order\n",
        ("at 'tools'", "found 'lookup_order' (string)", "expected a list"),
        files={"tools.py": GOOD_TOOLS},
    ),
    Case(
        "unknown-tool",
        "name: a\nmodel: openai:gpt-4o\ntools: [lookup, ask_human]\n",
        (":3:", "at 'tools[0]'", "found the tool 'lookup'", "known tools: lookup_order"),
        files={"tools.py": GOOD_TOOLS},
    ),
    Case(
        "tool-without-tools-py",
        "name: a\nmodel: openai:gpt-4o\ntools: [lookup_order]\n",
        ("at 'tools[0]'", "the tool 'lookup_order'", "there is none in"),
    ),
    Case(
        "tools-py-import-error",
        "name: a\nmodel: openai:gpt-4o\n",
        (":3:", "importing tools.py", "found ZeroDivisionError", "imports cleanly"),
        files={"tools.py": "import math\n\nBROKEN = 1 / 0\n"},
        file="tools.py",
    ),
    Case(
        "tools-py-varargs",
        "name: a\nmodel: openai:gpt-4o\n",
        (":1:", "tool 'bad'", "parameter 'args'", "expected tool functions with named"),
        files={"tools.py": "def bad(*args: int) -> int:\n    return 0\n"},
        file="tools.py",
    ),
    Case(
        "temperature-too-high",
        "name: a\nmodel: openai:gpt-4o\nmodel_params: {temperature: 5}\n",
        ("at 'model_params.temperature'", "found 5 (integer)", "expected a number <= 2"),
    ),
    Case(
        "temperature-for-anthropic",
        "name: a\nmodel: anthropic:claude-sonnet-4-5\nmodel_params: {temperature: 0.2}\n",
        (
            ":3:",
            "at 'model_params.temperature'",
            "found temperature for the anthropic model 'anthropic:claude-sonnet-4-5'",
            "version 2026-10-21",
            "leave it out",
        ),
    ),
    Case(
        "top-p-for-an-anthropic-process",
        "name: a\nmodel: openai:gpt-4o\nmodel_params: {top_p: 0.9}\nprocesses:\n"
        "  review:\n    model: anthropic:claude-sonnet-4-5\n    model_params: {top_k: 5}\n",
        ("at 'model_params.top_p'", "at 'processes.review.model_params.top_k'", "refuses"),
    ),
    Case(
        "api-key-in-model-params",
        "name: a\nmodel: openai:gpt-4o\nmodel_params: {api_key: sk-secret-123}\n",
        ("at 'model_params'", "'api_key' is a connection setting", "under 'providers:'"),
    ),
    Case(
        "custom-provider-without-type",
        "name: a\nmodel: ollama:llama3\nproviders:\n  ollama: {base_url: 'http://x/v1'}\n",
        (
            ":4:",
            "at 'providers.ollama.type'",
            "one of ['anthropic', 'openai', 'openai-responses', 'scripted']",
        ),
    ),
    Case(
        "api-key-in-provider",
        "name: a\nmodel: openai:gpt-4o\nproviders:\n  openai: {api_key: sk-secret-123}\n",
        ("at 'providers.openai.api_key'", "unknown key 'api_key'", "did you mean 'api_key_env'?"),
    ),
    Case(
        "api-key-pasted-into-api-key-env",
        "name: a\nmodel: openai:gpt-4o\nproviders:\n  openai: {api_key_env: sk-secret-123}\n",
        (
            "at 'providers.openai.api_key_env'",
            "not shown: it may be a secret",
            "the name of an environment variable",
        ),
    ),
    Case(
        "unknown-process-key",
        "name: a\nmodel: openai:gpt-4o\nprocesses:\n  triage:\n    modle: openai:gpt-4o\n",
        (":5:", "at 'processes.triage.modle'", "did you mean 'model'?"),
    ),
    Case(
        "process-unknown-mcp-server",
        "name: a\nmodel: openai:gpt-4o\nprocesses:\n  triage: {mcp_servers: [files]}\n",
        (
            ":4:",
            "at 'processes.triage.mcp_servers[0]'",
            "found the server 'files'",
            "declared under the top-level 'mcp_servers:' (declared: none)",
        ),
    ),
    Case(
        "processes-not-a-mapping",
        "name: a\nmodel: openai:gpt-4o\nprocesses: [main, triage]\n",
        ("at 'processes'", "found ['main', 'triage'] (list)", "expected a mapping"),
    ),
    Case(
        "process-bad-name",
        "name: a\nmodel: openai:gpt-4o\nprocesses:\n  'bad name': {}\n",
        ("at 'processes'", "process name 'bad name'", "letters, digits"),
    ),
    Case(
        "entry-bad-format",
        "name: a\nentry: agent.main\n",
        ("at 'entry'", "found 'agent.main' (string)", "expected 'module:function'"),
    ),
    Case(
        "entry-module-missing",
        "name: a\nentry: nowhere:main\n",
        ("at 'entry'", "no nowhere.py in", "'module:function'"),
    ),
    Case(
        "entry-function-missing",
        "name: a\nentry: agent:mian\n",
        ("at 'entry'", "has no attribute 'mian'", "an async function"),
        files={"agent.py": "async def main(ctx, input):\n    return {}\n"},
    ),
    Case(
        "entry-not-async",
        "name: a\nentry: agent:main\n",
        ("at 'entry'", "a plain (not async) function", "'async def main(ctx, input)'"),
        files={"agent.py": "def main(ctx, input):\n    return {}\n"},
    ),
    Case(
        "mcp-server-without-command",
        "name: a\nmodel: openai:gpt-4o\nmcp_servers:\n  files: {args: [x]}\n",
        ("at 'mcp_servers.files.command'", "found nothing", "required key 'command'"),
    ),
    Case(
        "pricing-bad-ref",
        "name: a\nmodel: openai:gpt-4o\npricing:\n  gpt-4o: "
        "{input_usd_per_mtok: 1, output_usd_per_mtok: 2}\n",
        ("at 'pricing'", "'provider:model'", "found 'gpt-4o'"),
    ),
    Case(
        "pricing-negative",
        "name: a\nmodel: openai:gpt-4o\npricing:\n  'openai:gpt-4o': "
        "{input_usd_per_mtok: -1, output_usd_per_mtok: 2}\n",
        ("at 'pricing.openai:gpt-4o.input_usd_per_mtok'", "found -1", "a number >= 0"),
    ),
    Case(
        "budget-for-an-unpriced-model",
        "name: a\nmodel: openai:gpt-9-turbo\nlimits: {max_cost_usd: 1}\n"
        "processes:\n  other: {description: x}\n",
        (
            ":3:",
            "at 'limits.max_cost_usd'",
            "a budget for 'openai:gpt-9-turbo', a model the price table does not know",
            "expected a price for it under 'pricing:'",
        ),
    ),
    Case(
        "process-budget-for-an-unpriced-model",
        "name: a\nmodel: openai:gpt-4o\nprocesses:\n"
        "  cheap:\n    model: anthropic:claude-9\n    limits: {max_cost_usd: 1}\n",
        ("at 'processes.cheap.limits.max_cost_usd'", "'anthropic:claude-9'"),
    ),
    Case(
        "human-timeout-negative",
        "name: a\nmodel: openai:gpt-4o\nhuman: {timeout: -1}\n",
        ("at 'human.timeout'", "found -1 (integer)", "expected a number > 0"),
    ),
]


def test_there_are_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


def _write(tmp_path: Path, case: Case) -> Path:
    root = tmp_path / case.id
    root.mkdir()
    (root / "agent.yaml").write_text(case.yaml, encoding="utf-8")
    for name, body in case.files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(body), encoding="utf-8")
    return root


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_agent_gives_a_clear_message(tmp_path: Path, case: Case) -> None:
    root = _write(tmp_path, case)
    with pytest.raises(AgentConfigError) as info:
        load_agent(root)
    message = str(info.value)
    assert str(root / case.file) in message, message
    for fragment in case.expect:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert "found" in message and "expected" in message, message
    for noise in ("Traceback", "validation error", "errors.pydantic.dev", "sk-secret-123"):
        assert noise not in message, message
    assert info.value.__cause__ is None or case.file != "agent.yaml"


def test_several_problems_are_listed_together(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        Case("many", "name: a\nmodle: x\nlimits: {max_steps: 0}\n", ()),
    )
    with pytest.raises(AgentConfigError) as info:
        load_agent(root)
    message = str(info.value)
    assert "2 problems" in message
    assert "at 'modle'" in message and "at 'limits.max_steps'" in message
    assert info.value.details["key"] == "limits.max_steps" or info.value.details["key"] == "modle"


def test_a_budget_is_checked_against_the_agents_own_prices(tmp_path: Path) -> None:
    """A priced model (from the table or the agent's ``pricing:``) keeps its budget; the
    offline model is free, hence priced."""
    for name, yaml in {
        "table": "name: a\nmodel: openai:gpt-4o-mini\nlimits: {max_cost_usd: 1}\n",
        "own": "name: b\nmodel: openai:gpt-9\nlimits: {max_cost_usd: 1}\npricing:\n"
        "  'openai:gpt-9': {input_usd_per_mtok: 1, output_usd_per_mtok: 2}\n",
        "free": "name: c\nmodel: scripted:script.yaml\nlimits: {max_cost_usd: 1}\n",
    }.items():
        root = _write(
            tmp_path, Case(name, yaml, (), files={"script.yaml": "default: {text: hi}\n"})
        )
        assert load_agent(root).processes["main"].limits.max_cost_usd == 1.0


def test_missing_directory_and_missing_agent_yaml(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match="found nothing"):
        load_agent(tmp_path / "nope")
    with pytest.raises(AgentConfigError, match="without agent.yaml"):
        load_agent(tmp_path)
