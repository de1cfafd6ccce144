"""A broken ``script.yaml`` of the ``scripted`` model is an agent error at load time: the
command says which file, what is wrong and what shape is expected, and no run is created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.cli.conftest import invoke

BROKEN = {
    "bad-yaml": ('responses: [\n  - text: "x"\n', ":2: at line 2", "invalid YAML"),
    "not-a-mapping": ("- text: hi\n", "at the top level", "a mapping with 'responses:"),
    "responses-a-string": ('responses: "hello"\n', "at 'responses'", "a list such as"),
    "unknown-key": ("reponses: []\n", "at 'reponses'", "one of the keys responses, rules"),
    "reply-not-a-mapping": ("responses: [hi]\n", "at 'responses[0]'", "a reply: a mapping"),
    "tool-calls-a-mapping": (
        "responses:\n  - tool_calls: {name: x}\n",
        ":2: at 'responses[0].tool_calls'",
        "a list of tool calls",
    ),
    "stream-chunk-zero": ("stream_chunk: 0\n", "at 'stream_chunk'", "an integer >= 1"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_script_fails_the_load_and_creates_no_run(
    runner: CliRunner, chain: Path, case: str
) -> None:
    text, where, expected = BROKEN[case]
    script = chain / "script.yaml"
    script.write_text(text, encoding="utf-8")

    result = invoke(runner, "run", "chain", "--input", "{}")

    assert result.exit_code == 5, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: {script}") or f"- {script}" in result.stderr, first
    assert where in result.stderr and expected in result.stderr
    assert "hint: fix the file named above" in result.stderr
    assert "Traceback" not in result.output
    listed = invoke(runner, "runs", "list", "--agents", "chain", "--json")
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == []


def test_the_scaffolds_script_and_the_test_agents_script_load(chain: Path) -> None:
    from toren.cli.project import SCRIPT_YAML
    from toren.providers.scripted import check_script, load_script

    assert load_script(chain / "script.yaml")["stream_chunk"] == 3
    import yaml

    assert "responses" in check_script(yaml.safe_load(SCRIPT_YAML), "scaffold")
