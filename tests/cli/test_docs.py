"""docs/cli.md against the code: every command, every exit code and every environment
variable of the CLI is documented, and nothing documented is missing from the code."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import click

import toren.cli
from toren.cli.main import cli

DOC = (Path(__file__).parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
# deploy-aws has its own page (docs/deploy.md), which documents its options.
OWN_PAGE = {"deploy-aws"}


def _section(title: str) -> str:
    start = DOC.index(title)
    rest = DOC[start + len(title) :]
    end = re.search(r"^#{2,3} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def _commands() -> dict[str, click.Command]:
    ctx = click.Context(cli)
    found: dict[str, click.Command] = {}

    def walk(group: click.Group, prefix: str) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None
            found[prefix + name] = command
            if isinstance(command, click.Group):
                walk(command, prefix + name + " ")

    walk(cli, "")
    return found


def test_every_exit_code_in_the_code_is_documented_and_only_those() -> None:
    in_code: dict[int, str] = {}
    for info in pkgutil.iter_modules(toren.cli.__path__):
        module = importlib.import_module(f"toren.cli.{info.name}")
        for name, value in vars(module).items():
            if name.startswith("EXIT_") and isinstance(value, int):
                in_code.setdefault(value, f"{info.name}.{name}")
    table = _section("### Exit codes")
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert documented == set(in_code), (sorted(documented), in_code)


def test_every_command_is_documented_and_every_documented_command_exists() -> None:
    commands = _commands()
    top = {name for name in commands if " " not in name}
    listed = set(re.findall(r"^\| \[?`toren ([a-z-]+)", DOC, re.MULTILINE))
    assert listed == top, (sorted(listed), sorted(top))
    sections = set(re.findall(r"^## toren ([a-z-]+)$", DOC, re.MULTILINE))
    assert sections == top - OWN_PAGE
    runs = {name.split(" ", 1)[1] for name in commands if name.startswith("runs ")}
    in_runs_table = set(re.findall(r"^\| `toren runs ([a-z]+)", _section("## toren runs"), re.M))
    assert in_runs_table == runs


def test_every_environment_variable_is_documented() -> None:
    in_code = {
        var
        for name, command in [("", cli), *_commands().items()]
        if name not in OWN_PAGE
        for param in command.params
        for var in ([param.envvar] if isinstance(param.envvar, str) else param.envvar or [])
    }
    table = _section("### Environment variables")
    documented = set(re.findall(r"`(TOREN_[A-Z_]+)`", table))
    assert in_code <= documented, sorted(in_code - documented)


def test_every_documented_option_exists() -> None:
    commands = _commands()
    for name, command in commands.items():
        if name in OWN_PAGE or isinstance(command, click.Group):
            continue
        synopsis = re.search(rf"^toren {re.escape(name)}\b(.*?)```", DOC, re.MULTILINE | re.S)
        row = re.search(rf"^\| `toren {re.escape(name)}\b([^`]*)`", DOC, re.MULTILINE)
        text = (synopsis or row).group(1) if (synopsis or row) else ""
        assert text or not command.params, name
        documented = set(re.findall(r"--[a-z][a-z-]*", text))
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        assert documented <= options, (name, sorted(documented - options))
        if synopsis is not None:  # a synopsis lists them all (hidden ones are deprecated)
            shown = {
                o
                for p in command.params
                if isinstance(p, click.Option) and not p.hidden
                for o in p.opts
                if o.startswith("--")
            }
            assert shown <= documented, (name, sorted(shown - documented))


def test_agent_yaml_docs_show_the_schema_line_toren_init_writes(tmp_path: Path) -> None:
    """Issue 40 item 9: docs/agent-yaml.md shows, as a YAML block of its own, the first
    line that `toren init` writes; and the `n` row does not call leaving `n` out an error
    (the OpenAI provider accepts it left out)."""
    from toren.cli.project import scaffold

    scaffold(tmp_path / "hello")
    first = (tmp_path / "hello" / "agent.yaml").read_text().splitlines()[0]
    doc = (Path(__file__).parents[2] / "docs" / "agent-yaml.md").read_text(encoding="utf-8")
    assert f"```yaml\n{first}\n```" in doc
    (row,) = [line for line in doc.splitlines() if line.startswith("| `n` |")]
    assert "leaving it out) fails" not in row and "leave it out" in row
