"""agent.yaml: the published JSON Schema, deprecated aliases, process inheritance."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import jsonschema
import pytest
import yaml

from toren.agents import TorenDeprecationWarning, load_agent
from toren.agents.config import (
    DEPRECATED_KEYS,
    AgentConfig,
    agent_json_schema,
    render_schema,
    schema_path,
)
from toren.errors import AgentConfigError

EXAMPLE = Path(__file__).parents[2] / "examples" / "support-agent"


def test_committed_schema_equals_generated() -> None:
    assert schema_path().read_text(encoding="utf-8") == render_schema(), (
        "agent.schema.json is stale; regenerate it with: "
        'python -c "from toren.agents.config import write_schema; write_schema()"'
    )


def test_schema_is_valid_and_accepts_the_example() -> None:
    schema = agent_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    data = yaml.safe_load((EXAMPLE / "agent.yaml").read_text())
    jsonschema.validate(data, schema)


def test_schema_rejects_unknown_keys_and_accepts_the_schema_line() -> None:
    schema = agent_json_schema()
    jsonschema.validate({"$schema": "x", "name": "a", "model": "openai:gpt-4o"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "a", "modle": "openai:gpt-4o"}, schema)


def test_schema_marks_deprecated_keys() -> None:
    schema = agent_json_schema()
    for old in DEPRECATED_KEYS:
        assert schema["properties"][old]["deprecated"] is True
        assert schema["$defs"]["ProcessConfig"]["properties"][old]["deprecated"] is True


def _agent(tmp_path: Path, text: str) -> Path:
    (tmp_path / "agent.yaml").write_text(text)
    return tmp_path


def test_deprecated_system_prompt_still_works_with_a_warning(tmp_path: Path) -> None:
    root = _agent(
        tmp_path,
        "name: a\nmodel: openai:gpt-4o\nsystem_prompt: Be brief.\n"
        "processes:\n  other:\n    system_prompt: Be long.\n",
    )
    with pytest.warns(TorenDeprecationWarning) as record:
        agent = load_agent(root)
    messages = [str(w.message) for w in record]
    assert len(messages) == 2
    assert "'system_prompt' is deprecated, use 'instructions' instead" in messages[0]
    assert "toren-run 0.3.0" in messages[0] and str(root / "agent.yaml") in messages[0]
    assert "'processes.other.system_prompt'" in messages[1]
    assert agent.processes["main"].instructions == "Be brief."
    assert agent.processes["other"].instructions == "Be long."


def test_deprecation_warning_is_a_future_warning_so_users_see_it() -> None:
    assert issubclass(TorenDeprecationWarning, FutureWarning)
    assert not issubclass(TorenDeprecationWarning, DeprecationWarning)


def test_old_and_new_key_together_is_an_error(tmp_path: Path) -> None:
    root = _agent(tmp_path, "name: a\nmodel: openai:gpt-4o\nsystem_prompt: x\ninstructions: y\n")
    with pytest.raises(AgentConfigError, match="found both 'system_prompt'"):
        load_agent(root)


def test_current_keys_give_no_warning(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_agent(_agent(tmp_path, "name: a\nmodel: openai:gpt-4o\ninstructions: hi\n"))


def test_processes_inherit_and_override(tmp_path: Path) -> None:
    (tmp_path / "p.md").write_text("from a file")
    root = _agent(
        tmp_path,
        """
name: a
description: top
model: openai:gpt-4o-mini
instructions_file: p.md
model_params: {temperature: 0.5, max_tokens: 100, reasoning_effort: low}
limits: {max_steps: 10, max_cost_usd: 1.25}
processes:
  main:
    limits: {step_timeout: 5}
  other:
    model: openai:gpt-4o
    instructions: inline
    model_params: {temperature: 0}
    limits: {max_steps: 3}
""",
    )
    agent = load_agent(root)
    main, other = agent.processes["main"], agent.processes["other"]
    assert main.model == "openai:gpt-4o-mini" and main.instructions == "from a file"
    assert main.description == "top"
    assert main.limits.max_steps == 10 and main.limits.step_timeout == 5
    assert main.limits.max_cost_usd == 1.25
    assert other.model == "openai:gpt-4o" and other.instructions == "inline"
    assert dict(other.model_params) == {
        "max_tokens": 100,
        "reasoning_effort": "low",
        "temperature": 0.0,
    }
    assert other.limits.max_steps == 3 and other.limits.max_cost_usd == 1.25
    assert list(agent.processes) == ["main", "other"]


def test_process_can_switch_off_a_top_level_entry(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text("async def main(ctx, input):\n    return {'ok': 1}\n")
    root = _agent(
        tmp_path,
        "name: a\nentry: agent:main\nprocesses:\n  chat: {entry: null, model: openai:gpt-4o}\n",
    )
    agent = load_agent(root)
    assert agent.processes["main"].entry_fn is not None
    assert agent.processes["chat"].uses_builtin_loop


def test_custom_openai_compatible_provider(tmp_path: Path) -> None:
    root = _agent(
        tmp_path,
        "name: a\nmodel: ollama:llama3.2\nproviders:\n"
        "  ollama: {type: openai, base_url: 'http://localhost:11434/v1'}\n"
        "  openai: {api_key_env: MY_OPENAI_KEY, timeout: 30}\n",
    )
    agent = load_agent(root)
    assert agent.provider_types["ollama"] == "openai"
    assert agent.config.providers["openai"].api_key_env == "MY_OPENAI_KEY"


def test_model_params_are_plain_sorted_json() -> None:
    config = AgentConfig.model_validate(
        {"name": "a", "model": "openai:x", "model_params": {"top_p": 0.9, "stop": ["\n"]}}
    )
    assert config.model_params is not None
    params = config.model_params.as_params()
    assert params == {"stop": ["\n"], "top_p": 0.9}
    json.dumps(params)
