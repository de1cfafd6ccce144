"""Loading agent directories, code versions, the resolver and the example agent."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from toren.agents import DirectoryResolver, directory_hash, load_agent
from toren.agents.config import ProviderConfig
from toren.agents.loader import code_files, is_code_path
from toren.core.agent_api.program import AgentResolver, Registry
from toren.errors import AgentConfigError, AgentNotFound
from toren.providers.base import ModelRequest, ModelResponse, ToolCall

from .fakes import FakeContext

EXAMPLE = Path(__file__).parents[2] / "examples" / "support-agent"


def _agent(root: Path, text: str, **files: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "agent.yaml").write_text(text)
    for name, body in files.items():
        (root / name).write_text(body)
    return root


# -- code version -----------------------------------------------------------------------


def test_code_version_is_a_hash_of_the_directory(tmp_path: Path) -> None:
    root = _agent(tmp_path / "a", "name: a\nmodel: openai:gpt-4o\n", **{"tools.py": "X = 1\n"})
    first = directory_hash(root)
    assert len(first) == 16 and first == load_agent(root).code_version
    for ignored in (".toren", "__pycache__", ".git"):
        (root / ignored).mkdir(exist_ok=True)
        (root / ignored / "state").write_text("changes all the time")
    (root / "tools.cpython-311.pyc").write_bytes(b"\0")
    assert directory_hash(root) == first
    (root / "tools.py").write_text("X = 2\n")
    assert directory_hash(root) != first
    (root / "tools.py").write_text("X = 1\n")
    (root / "new.md").write_text("")
    assert directory_hash(root) != first


def test_docs_tests_and_editor_files_are_not_part_of_the_code_version(tmp_path: Path) -> None:
    """The rule of the code version (one function, also what ``toren dev`` reloads for):
    a README edit is the same version, a prompt edit is a new one."""
    root = _agent(
        tmp_path / "a",
        "name: a\nmodel: openai:gpt-4o\ninstructions_file: prompts/system.md\n",
        **{"tools.py": "X = 1\n", "README.md": "# a\n"},
    )
    (root / "prompts").mkdir()
    (root / "prompts" / "system.md").write_text("Be brief.\n")
    first = directory_hash(root)
    left_out = [
        "README.md",
        "readme.rst",
        "prompts/README.txt",
        "LICENSE",
        "CHANGELOG.md",
        "docs/guide.md",
        "tests/test_tools.py",
        "test_agent.py",
        "tools_test.py",
        "conftest.py",
        ".gitignore",
        ".env",
        ".tools.py.swp",
        "tools.py~",
        "#tools.py#",
        "tools.py.bak",
        "tools.cpython-311.pyc",
        "__pycache__/tools.cpython-311.pyc",
        "venv/lib/x.py",
        "node_modules/x/index.js",
        ".git/HEAD",
        ".toren/toren.db",
        ".venv/lib/x.py",
    ]
    for rel in left_out:
        assert not is_code_path(rel), rel
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"edited {rel}\n")
        assert directory_hash(root) == first, rel
    counted = [
        "agent.yaml",
        "tools.py",
        "prompts/system.md",
        "prompts/tests/case.md",  # only a top-level tests/ is the project's
        "prompts/license.md",  # LICENSE is documentation only at the top
        "license.py",
        "history.md",
        "script.yaml",
        "data/rates.json",
        "Dockerfile",
        "pyproject.toml",
    ]
    for rel in counted:
        assert is_code_path(rel), rel
    rels = [p.relative_to(root).as_posix() for p in code_files(root)]
    assert rels == ["agent.yaml", "prompts/system.md", "tools.py"]
    (root / "prompts" / "system.md").write_text("Be thorough.\n")
    assert directory_hash(root) != first


def test_the_hash_of_a_directory_with_nothing_left_out_is_unchanged(tmp_path: Path) -> None:
    """The rule changed which files count, not how they are hashed ("toren.agentdir.v1"):
    a directory holding only counted files keeps the version it had before."""
    root = _agent(tmp_path / "a", "name: a\nmodel: openai:gpt-4o\n", **{"tools.py": "X = 1\n"})
    assert directory_hash(root) == "93dd6195b6fb4bcb"  # as computed before the rule


def test_dev_watches_only_what_the_code_version_counts(tmp_path: Path) -> None:
    one = _agent(tmp_path / "agents" / "one", "name: one\nmodel: openai:gpt-4o\n")
    resolver = DirectoryResolver(tmp_path / "agents")
    assert resolver.is_code_change(one / "agent.yaml")
    assert resolver.is_code_change(one / "prompts" / "system.md")
    assert not resolver.is_code_change(one / "README.md")
    assert not resolver.is_code_change(one / ".agent.yaml.swp")
    assert not resolver.is_code_change(tmp_path / "agents" / "README.md")
    (tmp_path / "agents" / "two").mkdir()
    assert resolver.is_code_change(tmp_path / "agents" / "two")  # an agent directory made
    # Beside the agents: the database directory of `toren dev` (with its journal), a
    # virtualenv, git: no agent there, no reload (issue 40 item 10).
    (tmp_path / "agents" / ".toren").mkdir()
    assert not resolver.is_code_change(tmp_path / "agents" / ".toren")
    assert not resolver.is_code_change(tmp_path / "agents" / ".toren" / "toren.db-journal")
    assert not resolver.is_code_change(tmp_path / "agents" / ".git" / "index")
    assert not resolver.is_code_change(tmp_path / "agents" / "__pycache__" / "x.py")
    single = DirectoryResolver(one)
    assert single.is_code_change(one / "tools.py")
    assert not single.is_code_change(one / "docs" / "notes.md")
    assert not single.is_code_change(tmp_path / "elsewhere.py")
    resolver.load("one")
    shutil.rmtree(one)
    assert resolver.is_code_change(one)  # and one removed


def test_code_version_does_not_depend_on_where_the_directory_is(tmp_path: Path) -> None:
    a = shutil.copytree(EXAMPLE, tmp_path / "one" / "support-agent")
    b = shutil.copytree(EXAMPLE, tmp_path / "two" / "elsewhere")
    assert directory_hash(a) == directory_hash(b)


def test_explicit_code_version_wins(tmp_path: Path) -> None:
    root = _agent(tmp_path, "name: a\nmodel: openai:gpt-4o\n")
    agent = load_agent(root, code_version="git-3f2a9c1")
    assert agent.code_version == "git-3f2a9c1"
    assert agent.content_hash == directory_hash(root)


# -- agent code -------------------------------------------------------------------------


def test_two_agents_with_their_own_tools_py_do_not_collide(tmp_path: Path) -> None:
    one = _agent(
        tmp_path / "one",
        "name: one\nmodel: openai:gpt-4o\n",
        **{"tools.py": "def a() -> int:\n    return 1\n"},
    )
    two = _agent(
        tmp_path / "two",
        "name: two\nmodel: openai:gpt-4o\n",
        **{"tools.py": "def b() -> int:\n    return 2\n"},
    )
    assert list(load_agent(one).tools) == ["a"]
    assert list(load_agent(two).tools) == ["b"]


def test_entry_point_with_relative_import(tmp_path: Path) -> None:
    root = _agent(
        tmp_path,
        "name: a\nentry: flows.main:run\n",
        **{"helpers.py": "GREETING = 'hello'\n"},
    )
    (root / "flows").mkdir()
    (root / "flows" / "__init__.py").write_text("")
    (root / "flows" / "main.py").write_text(
        "from ..helpers import GREETING\n\n"
        "async def run(ctx, input):\n    return {'answer': GREETING}\n"
    )
    agent = load_agent(root)
    program = agent.program("main")
    assert program.fn is agent.processes["main"].entry_fn


async def test_entry_point_runs_against_the_context(tmp_path: Path) -> None:
    root = _agent(
        tmp_path,
        "name: a\nentry: agent:main\n",
        **{
            "agent.py": "async def main(ctx, input):\n"
            "    rows = await ctx.tool('double', {'x': input['x']})\n"
            "    return {'answer': rows}\n",
            "tools.py": "def double(x: int) -> int:\n    return 2 * x\n",
        },
    )
    program = load_agent(root).program()
    ctx = FakeContext(program=program)
    assert await program.fn(ctx, {"x": 21}) == {"answer": 42}  # type: ignore[arg-type]


def test_tools_py_function_replaces_the_builtin_of_the_same_name(tmp_path: Path) -> None:
    root = _agent(
        tmp_path,
        "name: a\nmodel: openai:gpt-4o\ntools: [ask_human]\n",
        **{"tools.py": "def ask_human(question: str) -> str:\n    return 'no'\n"},
    )
    program = load_agent(root).program()
    assert list(program.tools) == ["ask_human"]


# -- resolver ---------------------------------------------------------------------------


def test_resolver_over_a_project_directory(tmp_path: Path) -> None:
    _agent(tmp_path / "alpha", "name: alpha\nmodel: openai:gpt-4o\nprocesses: {triage: {}}\n")
    _agent(tmp_path / "beta-dir", "name: beta\nmodel: anthropic:claude-sonnet-4-5\n")
    (tmp_path / "not-an-agent").mkdir()
    resolver: AgentResolver = DirectoryResolver(tmp_path, code_version="v1")
    assert resolver.names() == ["alpha", "beta"]
    program = resolver.resolve("alpha", "triage")
    assert (program.agent, program.process, program.code_version) == ("alpha", "triage", "v1")
    assert program.processes == ("main", "triage")
    with pytest.raises(
        AgentNotFound, match="unknown agent 'gamma'; known agents: \\['alpha', 'beta'\\]"
    ):
        resolver.resolve("gamma", "main")
    with pytest.raises(AgentNotFound, match="agent 'alpha' has no process 'nope'"):
        resolver.resolve("alpha", "nope")


def test_the_resolver_gives_the_same_program_until_the_directory_changes(tmp_path: Path) -> None:
    """A worker's kept (sticky) tick continues only under the very program object it runs
    (toren.core.drivers.resume): ``resolve`` gives the same one for as long as the
    directory is the same, and a new one once it changed (a deploy, a ``toren dev``
    reload); each process its own, the registry's too."""
    one = _agent(tmp_path / "one", "name: one\nmodel: openai:gpt-4o\nprocesses: {triage: {}}\n")
    resolver = DirectoryResolver(tmp_path)
    main = resolver.resolve("one", "main")
    assert resolver.resolve("one", "main") is main
    triage = resolver.resolve("one", "triage")
    assert triage is not main and resolver.resolve("one", "triage") is triage
    (one / "agent.yaml").write_text(
        "name: one\nmodel: openai:gpt-4o-mini\nprocesses: {triage: {}}\n"
    )
    edited = resolver.resolve("one", "main")
    assert edited is not main and edited.code_version != main.code_version
    assert resolver.resolve("one", "main") is edited

    async def fn(ctx: object, input: object) -> object:
        return input

    reg = Registry()
    reg.add("two", fn)
    reg.add("two", fn, process="helper")  # two processes: each program lists both
    first = reg.resolve("two", "main")
    assert first.processes == ("helper", "main") and reg.resolve("two", "main") is first


def test_resolver_over_a_list_of_agent_dirs(tmp_path: Path) -> None:
    a = _agent(tmp_path / "a", "name: a\nmodel: openai:gpt-4o\n")
    b = _agent(tmp_path / "b", "name: b\nmodel: openai:gpt-4o\n")
    assert DirectoryResolver([a, b]).names() == ["a", "b"]


def test_duplicate_agent_names_are_an_error(tmp_path: Path) -> None:
    _agent(tmp_path / "a", "name: same\nmodel: openai:gpt-4o\n")
    _agent(tmp_path / "b", "name: same\nmodel: openai:gpt-4o\n")
    with pytest.raises(AgentConfigError, match="at 'name': found 'same'"):
        DirectoryResolver(tmp_path).names()


def test_resolver_reloads_edited_agents_under_a_new_code_version(tmp_path: Path) -> None:
    root = _agent(tmp_path / "a", "name: a\nmodel: openai:gpt-4o\ninstructions: v1\n")
    resolver = DirectoryResolver(tmp_path)
    first = resolver.resolve("a", "main")
    assert resolver.resolve("a", "main").code_version == first.code_version
    (root / "agent.yaml").write_text("name: a\nmodel: openai:gpt-4o\ninstructions: v2\n")
    second = resolver.resolve("a", "main")
    assert second.code_version != first.code_version
    assert resolver.load("a").processes["main"].instructions == "v2"


def test_agent_names_are_parsed_once_per_text_and_a_rename_is_seen_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every resolve asks every agent directory its name: its agent.yaml is read each
    time (an edit counts at once) but parsed only when its text is new."""
    _agent(tmp_path / "a", "name: first-name-a\nmodel: openai:gpt-4o\n")
    _agent(tmp_path / "b", "name: first-name-b\nmodel: openai:gpt-4o\n")
    parsed: list[str] = []
    safe_load = yaml.safe_load

    def counted(text: str) -> Any:
        parsed.append(text)
        return safe_load(text)

    monkeypatch.setattr(yaml, "safe_load", counted)
    resolver = DirectoryResolver(tmp_path)
    for _ in range(5):
        assert resolver.names() == ["first-name-a", "first-name-b"]
    names_parsed = [t for t in parsed if "first-name" in t]
    assert len(names_parsed) <= 2, names_parsed  # once per text (fewer: parsed before)
    (tmp_path / "a" / "agent.yaml").write_text("name: renamed-a\nmodel: openai:gpt-4o\n")
    assert resolver.names() == ["first-name-b", "renamed-a"]


def test_broken_agent_is_reported_on_resolve_and_does_not_hide_others(tmp_path: Path) -> None:
    _agent(tmp_path / "good", "name: good\nmodel: openai:gpt-4o\n")
    _agent(tmp_path / "bad", "name: bad\nmodel: openai:gpt-4o\nlimits: {max_steps: 0}\n")
    resolver = DirectoryResolver(tmp_path)
    assert resolver.names() == ["bad", "good"]
    resolver.resolve("good", "main")
    with pytest.raises(AgentConfigError, match="at 'limits.max_steps'"):
        resolver.resolve("bad", "main")


def test_provider_factory_builds_agent_bound_providers(tmp_path: Path) -> None:
    _agent(
        tmp_path / "a",
        "name: a\nmodel: scripted:s.yaml\n"
        "providers:\n  local: {type: openai, base_url: 'http://127.0.0.1:8000/v1'}\n"
        "processes:\n  other: {model: local:qwen}\n",
        **{"s.yaml": "responses: []\n"},
    )
    seen: list[tuple[str, str, ProviderConfig, Path]] = []

    class Dummy:
        def __init__(self, name: str) -> None:
            self.name = name

        async def complete(self, request: ModelRequest, *, on_delta: Any = None) -> ModelResponse:
            raise NotImplementedError

    def factory(name: str, type: str, config: ProviderConfig, root: Path) -> Any:
        seen.append((name, type, config, root))
        return Dummy(name) if type == "scripted" else None

    program = DirectoryResolver(tmp_path, provider_factory=factory).resolve("a", "main")
    assert [(n, t) for n, t, _, _ in seen] == [("local", "openai"), ("scripted", "scripted")]
    assert seen[0][2].base_url == "http://127.0.0.1:8000/v1"
    assert seen[1][3] == (tmp_path / "a").resolve()
    assert list(program.providers) == ["scripted"]


# -- the example agent ------------------------------------------------------------------


def _scripted(script_file: Path) -> Any:
    """A stand-in for the scripted provider, following the script format of the example."""
    script = yaml.safe_load(script_file.read_text())

    def respond(call: Any) -> ModelResponse:
        turn = sum(1 for m in call.messages if m["role"] == "assistant")
        entry = script["responses"][turn] if turn < len(script["responses"]) else script["default"]
        last_tool = next((m["content"] for m in reversed(call.messages) if m["role"] == "tool"), "")
        calls = tuple(
            ToolCall(id=f"t{turn}-{i}", name=c["name"], arguments=c.get("arguments", {}))
            for i, c in enumerate(entry.get("tool_calls", ()))
        )
        return ModelResponse(
            text=entry.get("text", "").format(last_tool=last_tool, turn=turn, last_user=""),
            tool_calls=calls,
        )

    return respond


async def test_example_support_agent_runs_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox = tmp_path / "outbox.jsonl"
    monkeypatch.setenv("SUPPORT_AGENT_OUTBOX", str(outbox))
    agent = load_agent(EXAMPLE)
    program = agent.program("main")
    assert set(program.tools) == {"lookup_order", "send_email"}
    assert program.tools["send_email"].side_effects is True
    assert program.tools["lookup_order"].side_effects is False
    ctx = FakeContext(program=program, responses=_scripted(EXAMPLE / "script.yaml"))
    out = await program.fn(ctx, "Where is my order A-17?")  # type: ignore[arg-type]
    assert out["answer"].startswith("Your order A-17 has shipped")
    assert '"status": "sent"' in out["answer"]
    assert [kind for kind, _ in ctx.steps] == ["model", "tool", "model", "tool", "model"]
    assert len(outbox.read_text().splitlines()) == 1
    system = ctx.model_calls[0].messages[0]
    assert system["role"] == "system" and "support agent" in system["content"]
    assert ctx.model_calls[0].params == {"max_tokens": 800, "temperature": 0.2}


def test_example_switches_to_openai_by_one_line(tmp_path: Path) -> None:
    copy = shutil.copytree(EXAMPLE, tmp_path / "support-agent")
    text = (copy / "agent.yaml").read_text()
    assert "# model: openai:gpt-4o-mini" in text
    (copy / "agent.yaml").write_text(
        text.replace("model: scripted:script.yaml\n", "model: openai:gpt-4o-mini\n", 1)
    )
    agent = load_agent(copy)
    assert agent.processes["main"].model == "openai:gpt-4o-mini"
    assert agent.processes["triage"].model == "openai:gpt-4o-mini"


# -- scripted:echo ------------------------------------------------------------------------


def test_scripted_echo_needs_no_script_file(tmp_path: Path) -> None:
    root = _agent(tmp_path / "a", "name: a\nmodel: scripted:echo\n")
    assert load_agent(root).processes["main"].model == "scripted:echo"


def test_a_file_named_echo_beside_scripted_echo_is_refused_as_ambiguous(tmp_path: Path) -> None:
    # The provider always serves scripted:echo itself; a script file of that name would be
    # silently ignored. Refused, with the spelling that does use the file.
    root = _agent(tmp_path / "a", "name: a\nmodel: scripted:echo\n", echo="default: {text: x}\n")
    with pytest.raises(AgentConfigError) as info:
        load_agent(root)
    message = str(info.value)
    assert "agent.yaml:2: at 'model'" in message
    assert "'scripted:echo' is the built-in echo model" in message
    assert "'scripted:./echo'" in message
    (root / "agent.yaml").write_text("name: a\nmodel: scripted:./echo\n")
    assert load_agent(root).processes["main"].model == "scripted:./echo"
