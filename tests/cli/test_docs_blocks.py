"""Every code block of README.md and docs/*.md that is a command or a Python or TypeScript
example runs here, against a scaffold (``toren init hello`` in a temporary directory), or
says on the line before its fence why it cannot::

    <!-- not-runnable: needs Docker and an AWS account -->

How a block runs, by its language tag:

- ``sh``, ``bash``, ``console``, ``shell``: with bash (``set -euo pipefail``) in the
  directory that holds ``hello/``; ``toren`` is this checkout's. ``toren dev`` and
  ``toren serve`` start in the background on a free port and are stopped when the block
  ends (``127.0.0.1:8000`` in the block means that port).
- ``python``: a block that defines ``main(ctx, input)`` is an agent's ``entry:``; it is
  saved as ``hello/agent.py`` and ``toren run`` runs it, its OpenAI calls answered by the
  loopback fake of tests/providers/fakes.py. Any other block runs as a script in the
  directory that holds ``hello/``.
- ``ts``, ``typescript``: with node, against ``toren dev`` serving the scaffold and the
  built ``@toren-run/client`` (clients/typescript); the client's own type-check covers
  the same blocks (clients/typescript/examples).

Blocks tagged ``text``, ``yaml``, ``json`` and the like are not commands and do not run;
an untagged block is an error, since it could be either. A failing block is reported as
``file:line``, with its output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import free_port, sub_env
from tests.providers.fakes import FAKE_KEY, Completion, serve_fake_models

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGE = ROOT / "clients" / "typescript"

SHELL = {"sh", "bash", "console", "shell"}
PYTHON = {"python", "py"}
TYPESCRIPT = {"ts", "typescript"}
NOT_COMMANDS = {"text", "yaml", "json", "toml", "ini", "http", "hcl", "dockerfile", "diff"}
DOCS_ADDRESS = re.compile(r"(127\.0\.0\.1|localhost):8000")

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<tag>[^\s`]*)")
NOT_RUNNABLE = re.compile(r"^\s*<!--\s*not-runnable:\s*(?P<reason>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    tag: str
    text: str
    not_runnable: str | None  # the reason, when the line before the fence gives one

    @property
    def where(self) -> str:
        shown = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{shown}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.tag in SHELL | PYTHON | TYPESCRIPT and self.not_runnable is None


def read_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        body = [line.removeprefix(indent) for line in lines[i + 1 : end]]
        mark = NOT_RUNNABLE.match(lines[i - 1]) if i > 0 else None
        reason = mark["reason"] if mark else None
        found.append(Block(path, i + 1, opening["tag"].lower(), "\n".join(body) + "\n", reason))
        i = end + 1
    return found


BLOCKS = [block for path in DOCS for block in read_blocks(path)]


def problems(blocks: list[Block]) -> list[str]:
    """What is wrong with the blocks' tags and marks, one line each, naming file:line."""
    problems = []
    for block in blocks:
        if not block.tag:
            problems.append(
                f"{block.where}: a code block without a language tag: tag it `sh`, `python` "
                "or `ts` if it is a command or an example (it then runs in "
                "tests/cli/test_docs_blocks.py), else `text`, `yaml` or `json`"
            )
        elif block.tag not in SHELL | PYTHON | TYPESCRIPT | NOT_COMMANDS:
            problems.append(f"{block.where}: unknown language tag {block.tag!r}")
        elif block.not_runnable is not None and not block.not_runnable:
            problems.append(f"{block.where}: `<!-- not-runnable: -->` without a reason")
    return problems


def test_every_block_is_tagged_and_runs_or_says_why_not() -> None:
    assert BLOCKS, "no code blocks found in README.md and docs/*.md"
    found = problems(BLOCKS)
    assert not found, "\n".join(found)


def test_the_parser_finds_tags_marks_and_lines(tmp_path: Path) -> None:
    """The check above can fail: a doc with each kind of block."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# T\n\n```sh\ntoren version\n```\n\n<!-- not-runnable: needs Docker -->\n"
        "```sh\ndocker compose up -d\n```\n\n- a list:\n\n  ```python\n  print(1)\n  ```\n"
        "\n```\nuntagged\n```\n",
        encoding="utf-8",
    )
    blocks = read_blocks(doc)
    assert [(b.line, b.tag, b.text, b.not_runnable, b.runs) for b in blocks] == [
        (3, "sh", "toren version\n", None, True),
        (8, "sh", "docker compose up -d\n", "needs Docker", False),
        (14, "python", "print(1)\n", None, True),
        (18, "", "untagged\n", None, False),
    ]
    (untagged,) = problems(blocks)
    assert untagged.startswith(f"{blocks[-1].where}: a code block without a language tag")


# -- running the blocks -------------------------------------------------------------------


@pytest.fixture(scope="module")
def scaffold(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding ``hello/``, as the README's first command leaves it."""
    site = tmp_path_factory.mktemp("scaffold")
    toren(site, "init", "hello")
    return site


@pytest.fixture
def site(scaffold: Path, tmp_path: Path) -> Path:
    """A copy of the scaffold of the test's own: blocks write to it (``.toren/``)."""
    copy = tmp_path / "site"
    shutil.copytree(scaffold, copy)
    return copy


def toren(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*TOREN, *args], cwd=cwd, env=sub_env(**env), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"toren {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


TOREN = [sys.executable, "-c", "from toren.cli.main import main; main()"]

# `toren` on the PATH of a shell block: this checkout's; `dev` and `serve` start in the
# background on TOREN_DOCS_PORT, their pids kept in TOREN_DOCS_PIDS for the test to stop.
SHIM = """\
import os, subprocess, sys, time, urllib.request

toren = [{python!r}, "-c", "from toren.cli.main import main; main()"]
args = sys.argv[1:]
if args[:1] not in (["dev"], ["serve"]):
    os.execv(toren[0], toren + args)
port = os.environ["TOREN_DOCS_PORT"]
log = open(os.environ["TOREN_DOCS_PIDS"] + ".log", "a")
server = subprocess.Popen(toren + args + ["--port", port], stdout=log, stderr=log)
with open(os.environ["TOREN_DOCS_PIDS"], "a") as pids:
    pids.write(f"{{server.pid}}\\n")
deadline = time.monotonic() + 60
while time.monotonic() < deadline and server.poll() is None:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{{port}}/v1/health", timeout=2)
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(f"toren {{args[0]}} did not answer on port {{port}}")
"""


@dataclass
class Shell:
    bin: Path
    pids: Path
    port: int

    def env(self, **extra: str) -> dict[str, str]:
        path = f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"
        return sub_env(
            PATH=path, TOREN_DOCS_PORT=str(self.port), TOREN_DOCS_PIDS=str(self.pids), **extra
        )


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    bin = tmp_path / "bin"
    bin.mkdir()
    (bin / "toren").write_text(f"#!{sys.executable}\n" + SHIM.format(python=sys.executable))
    (bin / "toren").chmod(0o755)
    (bin / "python").symlink_to(sys.executable)
    found = Shell(bin, tmp_path / "servers.pids", free_port())
    try:
        yield found
    finally:
        if found.pids.exists():
            for pid in found.pids.read_text().split():
                try:
                    os.kill(int(pid), signal.SIGTERM)
                except ProcessLookupError:
                    pass


def _failed(block: Block, done: subprocess.CompletedProcess[str], extra: str = "") -> str:
    return (
        f"{block.where}: the {block.tag} block failed (exit {done.returncode}){extra}\n"
        f"--- block\n{block.text}--- stdout\n{done.stdout[-4000:]}\n"
        f"--- stderr\n{done.stderr[-4000:]}"
    )


def run_shell(block: Block, site: Path, shell: Shell) -> None:
    script = DOCS_ADDRESS.sub(f"127.0.0.1:{shell.port}", block.text)
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=site,
        env=shell.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = Path(f"{shell.pids}.log")
    extra = f"\n--- server log\n{log.read_text()[-4000:]}" if log.exists() else ""
    assert done.returncode == 0, _failed(block, done, extra)


def run_python(block: Block, site: Path, shell: Shell) -> None:
    if not re.search(r"^(async )?def main\(ctx, input\)", block.text, re.M):
        (site / "block.py").write_text(block.text, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, "block.py"],
            cwd=site,
            env=shell.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, _failed(block, done)
        return
    agent = site / "hello"
    (agent / "agent.py").write_text(block.text, encoding="utf-8")
    with (agent / "agent.yaml").open("a", encoding="utf-8") as yaml:
        yaml.write("\nentry: agent:main\n")
    with serve_fake_models() as fake:
        fake.openai.responder = lambda body: Completion(text="Sunny, 21 °C.")
        done = subprocess.run(
            [*TOREN, "run", "hello", "What is the weather in Paris?"],
            cwd=site,
            env=shell.env(OPENAI_API_KEY=FAKE_KEY, OPENAI_BASE_URL=fake.openai_url),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, _failed(block, done, " as hello/agent.py")
        assert fake.openai.served >= 1, f"{block.where}: the agent called no model"
    (run,) = json.loads(toren(site, "runs", "list", "--agents", "hello", "--json").stdout)
    assert run["status"] == "completed", _failed(block, done)


def run_typescript(block: Block, site: Path, shell: Shell, tmp_path: Path) -> None:
    from tests.client_ts.support import ensure_built, node_and_npm

    node, _ = node_and_npm()
    ensure_built()
    scope = tmp_path / "node_modules" / "@toren-run"
    scope.mkdir(parents=True)
    (scope / "client").symlink_to(PACKAGE, target_is_directory=True)
    # The examples are JavaScript as well as TypeScript (no annotations): node runs them.
    example = tmp_path / "example.mjs"
    example.write_text(DOCS_ADDRESS.sub(f"127.0.0.1:{shell.port}", block.text), "utf-8")
    env = shell.env(TOREN_API_TOKEN="docs-token-0123456789abcdef")
    subprocess.run(["toren", "dev", "hello", "--no-console"], cwd=site, env=env, check=True)
    done = subprocess.run(
        [node, str(example)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, _failed(block, done)


def _params() -> Iterator[object]:
    for block in BLOCKS:
        if not block.runs:
            continue
        # TypeScript blocks build clients/typescript, as the client's own tests do.
        marks = [pytest.mark.xdist_group("clients_typescript")] if block.tag in TYPESCRIPT else []
        yield pytest.param(block, id=block.where, marks=marks)


@pytest.mark.parametrize("block", _params())
def test_block_runs(block: Block, site: Path, shell: Shell, tmp_path: Path) -> None:
    if block.tag in SHELL:
        run_shell(block, site, shell)
    elif block.tag in PYTHON:
        run_python(block, site, shell)
    else:
        run_typescript(block, site, shell, tmp_path)


def test_a_failing_block_names_its_file_and_line(site: Path, shell: Shell) -> None:
    block = Block(ROOT / "docs" / "cli.md", 7, "sh", "toren nosuchcommand\n", None)
    with pytest.raises(AssertionError, match=r"^docs/cli\.md:7: the sh block failed"):
        run_shell(block, site, shell)


def test_a_shell_block_reaches_toren_dev_on_the_docs_address(site: Path, shell: Shell) -> None:
    script = textwrap.dedent(
        """\
        cd hello
        toren dev --no-console
        curl -fsS http://127.0.0.1:8000/v1/health
        toren runs list
        """
    )
    run_shell(Block(ROOT / "README.md", 1, "sh", script, None), site, shell)
    assert httpx.get(f"http://127.0.0.1:{shell.port}/v1/health").status_code == 200
