"""``toren init``: scaffold an agent project that runs offline on the first try."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import click

from toren.agents.config import SCHEMA_URL
from toren.cli._common import err, examples, fail, out

AGENT_YAML = """\
$schema: {schema}
name: {name}
description: A starter agent. Edit prompts/system.md and tools.py; `toren dev` reloads them.

# Offline and deterministic: replies come from script.yaml, no API key needed.
model: scripted:script.yaml
# To use a real model, replace the line above with one of these (and export its key):
# model: openai:gpt-4o-mini                 # needs OPENAI_API_KEY
# model: anthropic:claude-haiku-4-5         # needs ANTHROPIC_API_KEY

instructions_file: prompts/system.md
tools: [get_weather]

limits:
  max_steps: 10
  max_cost_usd: 0.10
"""

SYSTEM_PROMPT = """\
You are a friendly assistant.

- Use `get_weather` before saying anything about the weather.
- Answer in one or two sentences.
"""

TOOLS_PY = '''\
"""Tools of this agent. Every public function here is a tool; its JSON schema comes from
the type hints and the docstring. Tool calls are recorded: a replayed run reuses the
result instead of calling the tool again."""

from __future__ import annotations

from toren import tool


@tool(side_effects=False)
def get_weather(city: str) -> dict[str, object]:
    """Today's weather for a city (a stand-in: call a real weather API here).

    Args:
        city: The city name, e.g. "Paris".
    """
    return {"city": city, "forecast": "sunny", "high_c": 21}
'''

SCRIPT_YAML = """\
# The `scripted` model: turn i (the number of assistant messages so far) gets
# responses[i]; past the end, `default`. Placeholders: {last_user}, {last_tool}, {turn}.
responses:
  - text: "Let me check the weather."
    tool_calls:
      - {name: get_weather, arguments: {city: "Paris"}}
  # A script cannot read the question: it looks up Paris whatever the city, and says so.
  - text: >-
      You asked: {last_user} This scripted model (script.yaml) always looks up Paris:
      {last_tool}. Set model: in agent.yaml to a real model to ask about any city.
default: {text: "done"}
latency: 0.1        # seconds per call, so the live view has something to show
stream_chunk: 6     # characters per streamed delta
"""

PYPROJECT = """\
[project]
name = "{name}"
version = "0.1.0"
description = "A Toren agent."
requires-python = ">=3.11"
# Pinned to the 0.x line: minors are additive; a major is a decision.
dependencies = ["toren-run>=0.1,<1"]

[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

# Toren loads the agent from this directory: installing the project installs only its
# dependencies (no module of the directory is packaged).
[tool.setuptools]
py-modules = []
"""

GITIGNORE = """\
# Toren's local state: the embedded database of `toren dev` and `toren run`.
.toren/
__pycache__/
.venv/
"""

README = """\
# {name}

A [Toren](https://toren.run) agent.

```console
$ pip install -e .          # this project and toren-run>=0.1,<1, from your package index
$ toren run . "What is the weather in Paris?"
$ toren dev                 # worker + API + console on http://127.0.0.1:8000
```

Toren from a checkout instead of a package index: install it first into the same
environment (`pip install /path/to/toren`), then `pip install -e .` finds `toren-run`
there and takes nothing from the index for it (the index still serves setuptools, the
build backend). Both ways, for this machine and for the image, are in "Installing Toren"
of Toren's docs/deploy.md.

- `agent.yaml`: the model, instructions and tools. It runs offline with the `scripted`
  model (`script.yaml`); switch the `model:` line to `openai:gpt-4o-mini` for a real one.
- `prompts/system.md`: the system prompt.
- `tools.py`: the agent's tools.
- `pyproject.toml`: what `pip install -e .` installs (the project's dependencies).
- `Dockerfile`, `compose.yaml`: PostgreSQL, workers and the API with `docker compose up`.

The image installs `toren-run` from your package index. From a checkout instead, build a
wheel of it into `wheels/` (`pip wheel --no-deps -w wheels/ /path/to/toren`) and name it
when you build:

```console
$ docker compose build --build-arg TOREN_WHEEL=toren_run-0.1.0-py3-none-any.whl
$ docker compose up -d
```

Upgrading and rolling back: see Toren's docs/deploy.md.
"""


PYDANTIC_AI_YAML = """\
$schema: {schema}
name: {name}
description: A pydantic-ai agent on Toren. Edit app.py; `toren dev` reloads it.

# The entry names a pydantic_ai.Agent: each of its model requests and tool calls is a
# durable step (see Toren's docs/pydantic-ai.md).
entry: app:agent

limits:
  max_steps: 20
"""

PYDANTIC_AI_APP = '''\
"""A pydantic-ai agent, unmodified: Toren runs it from agent.yaml's `entry: app:agent`.

Offline and deterministic: the model is pydantic-ai's FunctionModel (`offline_model`
below), no API key needed. For a real model, replace `model=` with one of:

    model = "openai:gpt-4o-mini"                  # needs OPENAI_API_KEY
    model = "anthropic:claude-haiku-4-5"          # needs ANTHROPIC_API_KEY
"""

from __future__ import annotations

from pydantic import BaseModel
from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from toren import tool


class Forecast(BaseModel):
    city: str
    summary: str


def offline_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asks for the weather once, then answers with what the tool returned."""
    returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returns:
        return ModelResponse(
            parts=[
                TextPart(content="Let me check the weather."),
                ToolCallPart(
                    tool_name="get_weather",
                    args={"city": "Paris"},
                    tool_call_id="call-1",
                ),
            ]
        )
    weather = returns[-1].content
    summary = f"{weather['forecast']}, up to {weather['high_c']} °C"
    return ModelResponse(
        parts=[
            ToolCallPart(
                tool_name="final_result",
                args={"city": "Paris", "summary": summary},
                tool_call_id="call-2",
            )
        ]
    )


agent = Agent(
    FunctionModel(offline_model),
    instructions="You are a friendly assistant. Use get_weather before talking about weather.",
    output_type=Forecast,
)


@agent.tool_plain
@tool(side_effects=False)  # a read: after an invalidation it runs again (fresh data)
def get_weather(city: str) -> dict[str, object]:
    """Today's weather for a city (a stand-in: call a real weather API here)."""
    return {"city": city, "forecast": "sunny", "high_c": 21}
'''

PYDANTIC_AI_PYPROJECT = """\
[project]
name = "{name}"
version = "0.1.0"
description = "A pydantic-ai agent on Toren."
requires-python = ">=3.11"
dependencies = ["toren-run[pydantic-ai]>=0.1,<1"]

[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

# Toren loads the agent from this directory: installing the project installs only its
# dependencies (no module of the directory is packaged).
[tool.setuptools]
py-modules = []
"""

PYDANTIC_AI_README = """\
# {name}

A [pydantic-ai](https://ai.pydantic.dev) agent run by [Toren](https://toren.run): every
model request and tool call is a durable step.

```console
$ pip install -e .          # toren-run[pydantic-ai]>=0.1,<1
$ toren run . "What is the weather in Paris?"
$ toren dev                 # worker + API + console on http://127.0.0.1:8000
```

- `agent.yaml`: `entry: app:agent` names the pydantic-ai agent.
- `app.py`: the agent. It runs offline with pydantic-ai's `FunctionModel`; set
  `model="openai:gpt-4o-mini"` for a real one.

See Toren's docs/pydantic-ai.md for what becomes a step and what a deploy does.
"""

# -- the openai-agents template: an OpenAI Agents SDK agent, offline on the scripted model --

OA_AGENT_YAML = """\
$schema: {schema}
name: {name}
description: An OpenAI Agents SDK agent run by Toren. Edit app.py; `toren dev` reloads it.

# The entry names the SDK Agent object; Toren runs it with the SDK's Runner and records
# every model call, tool call and handoff as a step (docs/openai-agents.md).
entry: app:agent

# The scripted model of app.py reads script.yaml from this directory.
providers:
  scripted: {{}}

limits:
  max_steps: 20
  max_cost_usd: 0.10
"""

OA_APP_PY = '''\
"""An OpenAI Agents SDK agent. Toren runs it unmodified: `toren run . "Weather in Paris?"`.

Offline and deterministic: its model is Toren's scripted model (script.yaml). For a real
one, replace `model=` with one of these (and export OPENAI_API_KEY):

    from agents import OpenAIResponsesModel
    from openai import AsyncOpenAI
    model = OpenAIResponsesModel(model="gpt-4.1", openai_client=AsyncOpenAI())
"""

from __future__ import annotations

from agents import Agent, function_tool

from toren.integrations.openai_agents import TorenModel, tool_options


@function_tool
def get_weather(city: str) -> dict[str, object]:
    """Today's weather for a city (a stand-in: call a real weather API here)."""
    return {{"city": city, "forecast": "sunny", "high_c": 21}}


# A read: after a prompt edit it runs again instead of reusing the recorded result.
get_weather = tool_options(get_weather, side_effects=False)

agent = Agent(
    name="{name}",
    instructions="You are a friendly assistant. Use get_weather before talking about "
    "the weather. Answer in one or two sentences.",
    model=TorenModel("scripted:script.yaml"),
    tools=[get_weather],
)
'''

OA_SCRIPT_YAML = """\
# The `scripted` model: turn i (the number of assistant messages so far) gets
# responses[i]; past the end, `default`. Placeholders: {{last_user}}, {{last_tool}}, {{turn}}.
responses:
  - tool_calls:
      - {{name: get_weather, arguments: {{city: "Paris"}}}}
  - text: "It is sunny in Paris today, up to 21 °C. (get_weather said: {{last_tool}})"
default: {{text: "done"}}
stream_chunk: 6
"""

OA_PYPROJECT = """\
[project]
name = "{name}"
version = "0.1.0"
description = "An OpenAI Agents SDK agent on Toren."
requires-python = ">=3.11"
# Pinned to the 0.x line: minors are additive; a major is a decision.
dependencies = ["toren-run[openai-agents]>=0.1,<1"]

[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

# Toren loads the agent from this directory: installing the project installs only its
# dependencies (no module of the directory is packaged).
[tool.setuptools]
py-modules = []
"""

OA_README = """\
# {name}

An [OpenAI Agents SDK](https://openai.github.io/openai-agents-python/) agent run by
[Toren](https://toren.run): every model call, tool call and handoff is a recorded step,
so a crash, a restart or a deploy resumes the run without paying for a call twice.

```console
$ pip install -e .          # toren-run[openai-agents]
$ toren run . "What is the weather in Paris?"
$ toren dev                 # worker + API + console on http://127.0.0.1:8000
```

- `app.py`: the SDK `Agent` (`entry: app:agent` in `agent.yaml`). It runs offline on
  Toren's scripted model (`script.yaml`); switch `model=` to an `OpenAIResponsesModel`
  for a real one.
- Toren's docs/openai-agents.md: what is recorded, approvals, what is supported.
"""


def openai_agents_files(name: str) -> dict[str, str | Callable[[], str]]:
    """The ``--template openai-agents`` project: an SDK agent that runs offline."""
    return {
        "agent.yaml": OA_AGENT_YAML.format(schema=SCHEMA_URL, name=name),
        "app.py": OA_APP_PY.format(name=name),
        "script.yaml": OA_SCRIPT_YAML.format(),
        "pyproject.toml": OA_PYPROJECT.format(name=name),
        ".gitignore": GITIGNORE,
        "README.md": OA_README.format(name=name),
        "Dockerfile": _docker("render_project_dockerfile"),
        "compose.yaml": _docker("render_project_compose"),
        ".dockerignore": _docker("render_project_dockerignore"),
    }


TEMPLATES = ("default", "openai-agents", "pydantic-ai")


def _docker(name: str) -> Callable[[], str]:
    def render() -> str:
        from toren.adapters import docker

        renderer: Callable[[], str] = getattr(docker, name)
        return renderer()

    return render


def agent_name(directory: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", directory.name).strip("-._")[:64]
    return name or "agent"


def project_files(name: str, template: str = "default") -> dict[str, str | Callable[[], str]]:
    """Relative path -> content (or a function producing it) of a new project."""
    docker = {
        "Dockerfile": _docker("render_project_dockerfile"),
        "compose.yaml": _docker("render_project_compose"),
        ".dockerignore": _docker("render_project_dockerignore"),
    }
    if template == "openai-agents":
        return openai_agents_files(name)
    if template == "pydantic-ai":
        return {
            "agent.yaml": PYDANTIC_AI_YAML.format(schema=SCHEMA_URL, name=name),
            "app.py": PYDANTIC_AI_APP,
            "pyproject.toml": PYDANTIC_AI_PYPROJECT.format(name=name),
            ".gitignore": GITIGNORE,
            "README.md": PYDANTIC_AI_README.format(name=name),
            **docker,
        }
    return {
        "agent.yaml": AGENT_YAML.format(schema=SCHEMA_URL, name=name),
        "prompts/system.md": SYSTEM_PROMPT,
        "tools.py": TOOLS_PY,
        "script.yaml": SCRIPT_YAML,
        "pyproject.toml": PYPROJECT.format(name=name),
        ".gitignore": GITIGNORE,
        "README.md": README.format(name=name),
        "Dockerfile": _docker("render_project_dockerfile"),
        "compose.yaml": _docker("render_project_compose"),
        ".dockerignore": _docker("render_project_dockerignore"),
    }


def scaffold(
    directory: Path, *, force: bool = False, name: str | None = None, template: str = "default"
) -> list[Path]:
    """Write a new project into ``directory``; refuses to overwrite unless ``force``.

    All or nothing: every file is rendered and written to a staging directory first, then
    moved into place; if a move fails, the files already moved are taken back out and the
    originals put back, so a failure never leaves a half-written (or half-overwritten)
    project."""
    files = project_files(name or agent_name(directory.resolve()), template)
    existing = [rel for rel in files if (directory / rel).exists()]
    if existing and not force:
        fail(
            f"{directory} already has {', '.join(existing)}; not overwriting",
            "pass --force to overwrite them, or choose another directory",
        )
    _refuse_what_is_not_a_file(directory, files)
    rendered = {rel: c if isinstance(c, str) else c() for rel, c in files.items()}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".toren-init-", dir=directory) as tmp:
            staged, backup = Path(tmp, "new"), Path(tmp, "old")
            for rel, text in rendered.items():
                (staged / rel).parent.mkdir(parents=True, exist_ok=True)
                (staged / rel).write_text(text, encoding="utf-8")
            _move_in(directory, staged, backup, list(rendered))
    except OSError as exc:
        fail(
            f"cannot write {exc.filename or directory}: {exc.strerror or exc}; nothing was "
            "changed (files already moved into place were taken back)",
            f"check that {directory} and its subdirectories are writable, then run "
            "'toren init' again",
        )
    return [directory / rel for rel in rendered]


def _refuse_what_is_not_a_file(directory: Path, files: Mapping[str, object]) -> None:
    """--force overwrites files, never a directory (or anything else) in their place."""
    for rel in files:
        for path in [*reversed(Path(rel).parents[:-1]), Path(rel)]:
            target = directory / path
            want_dir = path != Path(rel)
            if target.exists() and (target.is_dir() != want_dir or target.is_symlink()):
                fail(
                    f"{target} is {_kind(target)}; the scaffold needs "
                    f"{'a directory' if want_dir else 'a file'} there (nothing was written)",
                    "move it out of the way, or choose another directory",
                )


def _kind(path: Path) -> str:
    if path.is_symlink():
        return "a symbolic link"
    return "a directory" if path.is_dir() else "not a regular file"


def _move_in(directory: Path, staged: Path, backup: Path, rels: list[str]) -> None:
    """Move the staged files into place; on a failure, undo the moves and re-raise."""
    done: list[tuple[str, bool]] = []  # (file, whether its original went to backup)
    made: list[Path] = []  # directories created on the way
    try:
        for rel in rels:
            target = directory / rel
            for parent in reversed(target.parents):
                if parent.is_relative_to(directory) and not parent.exists():
                    parent.mkdir()
                    made.append(parent)
            had = target.exists()
            if had:
                (backup / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(target, backup / rel)
            done.append((rel, had))
            os.replace(staged / rel, target)
    except OSError:
        for rel, had in reversed(done):
            (directory / rel).unlink(missing_ok=True)
            if had:
                os.replace(backup / rel, directory / rel)
        for path in reversed(made):
            path.rmdir()
        raise


@click.command(
    help="Scaffold an agent project in DIR (default: the current directory). The agent "
    "runs offline with the scripted model; one line of agent.yaml switches it to OpenAI "
    "or Anthropic. Existing files are never overwritten unless --force is given."
    + examples(
        'toren init hello && cd hello && toren run . "Hi"',
        "toren init . --name support-bot",
        "toren init hello --force     # overwrite the scaffold's files",
        "toren init weather --template pydantic-ai   # a pydantic-ai Agent as the entry",
        "toren init triage --template openai-agents  # an OpenAI Agents SDK Agent",
    )
)
@click.argument("directory", default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite files that already exist.")
@click.option("--name", default=None, help="Agent name (default: the directory's name).")
@click.option(
    "--template",
    type=click.Choice(TEMPLATES),
    default="default",
    show_default=True,
    help="What the agent is written with: Toren's built-in loop, an OpenAI Agents SDK "
    "Agent (needs toren-run[openai-agents]) or a pydantic-ai Agent (needs "
    "toren-run[pydantic-ai]). All run offline.",
)
def init(directory: Path, force: bool, name: str | None, template: str) -> None:
    if name is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", name):
        raise click.BadParameter(
            f"{name!r} is not a valid agent name: letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            param_hint="--name",
        )
    written = scaffold(directory, force=force, name=name, template=template)
    console = out()
    console.print(f"created agent project in [bold]{directory}[/]:")
    for path in written:
        console.print(f"  {path.relative_to(directory).as_posix()}")
    go = "" if directory.resolve() == Path.cwd() else f"cd {directory} && "
    err().print(f'next: [bold]{go}toren run . "What is the weather in Paris?"[/]')
