"""The README's first command on a fresh install: build the wheel, install it into a new
virtual environment, then `toren init` and `toren run` the scaffolded agent, offline.

The environment sees the system site-packages only so that the dependencies (pydantic,
fastapi, ...) need not be downloaded again; the ``toren`` package itself must come from
the wheel, which the test checks.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import sub_env

ROOT = Path(__file__).resolve().parents[2]


def venv_env(**extra: str) -> dict[str, str]:
    """The subprocess environment without PYTHONPATH: a checkout's ``src`` on it (a git
    worktree is tested that way) would shadow the wheel the test installed."""
    env = sub_env(**extra)
    env.pop("PYTHONPATH", None)
    return env


def first_command() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```(?:sh|console|bash)?\n(.*?)```", text, re.S)
    assert block, "README.md must open with a code block of two commands"
    commands = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(commands) == 2, commands
    return commands[0].removeprefix("$ ")


def test_readme_opens_with_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.lstrip().startswith("# Toren")
    body = text.split("\n", 1)[1].lstrip()
    # The docs test's mark (tests/cli/test_docs_blocks.py) may precede the fence: no prose.
    body = re.sub(r"\A<!-- not-runnable: [^\n]* -->\n", "", body)
    assert body.startswith("```"), "the two commands come first, before any prose"
    first = first_command()
    assert first.startswith("pip install . && toren init hello")
    assert "toren run hello" in first
    second = body.split("\n")[2]
    assert second.startswith("pip install") and "pytest" in second
    assert second in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_wheel_install_init_and_run_offline(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(wheels)]
    if importlib.util.find_spec("hatchling") is not None:
        build.append("--no-build-isolation")  # no download of the build backend
    subprocess.run(build, check=True, capture_output=True, text=True, env=sub_env())
    (wheel,) = wheels.glob("toren_run-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python, toren = venv / "bin" / "python", venv / "bin" / "toren"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        env=venv_env(),
    )
    where = subprocess.run(
        [str(python), "-c", "import toren; print(toren.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=venv_env(),
    ).stdout.strip()
    assert where.startswith(str(venv)), f"toren imported from {where}, not from the wheel"

    # The README's first command, after its `pip install .`, in the new environment.
    steps = first_command().split(" && ")[1:]
    project = tmp_path / "work"
    project.mkdir()
    env = venv_env(PATH=f"{venv / 'bin'}:/usr/bin:/bin", NO_COLOR="1")
    env.pop("PIP_QUIET", None)  # CI sets it, and it silences `pip show` too
    result = None
    for step in steps:
        argv = _split(step)
        assert argv[0] == "toren", step
        result = subprocess.run(
            [str(toren), *argv[1:]],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"{step}\n{result.stdout}\n{result.stderr}"
    assert result is not None
    assert "✔ completed" in result.stdout
    assert "⚙ tool get_weather" in result.stdout
    assert (project / "hello" / ".toren" / "toren.db").is_file()


def _split(command: str) -> list[str]:
    import shlex

    return shlex.split(command)


def scaffold_install_command(project: Path) -> list[str]:
    """The first command of the scaffold README's console block, as written there."""
    text = (project / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```console\n(.*?)```", text, re.S)
    assert block, "the scaffold's README shows its commands in a console block"
    first = block.group(1).splitlines()[0].removeprefix("$ ")
    return shlex.split(first, comments=True)


@pytest.mark.slow  # a virtualenv, Toren and the scaffold installed into it
@pytest.mark.timeout(240)
def test_scaffold_installs_beside_a_toren_from_a_checkout(tmp_path: Path) -> None:
    """Issue 40 item 8: Toren installed from a checkout (not editable, and on no package
    index), then `toren init hello` and the scaffold README's `pip install -e .` as
    written, then `toren run hello ...` offline: pip takes toren-run as installed (the
    index has none), the project installs, editable, and the agent runs."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "-q", "--no-deps", str(ROOT)]
    if importlib.util.find_spec("hatchling") is not None:
        install.append("--no-build-isolation")  # no download of Toren's build backend
    subprocess.run(install, check=True, capture_output=True, text=True, env=venv_env())
    work = tmp_path / "work"
    work.mkdir()
    env = venv_env(PATH=f"{venv / 'bin'}:/usr/bin:/bin", NO_COLOR="1")
    env.pop("PIP_QUIET", None)  # CI sets it, and it silences `pip show` too

    def sh(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{argv}\n{done.stdout}\n{done.stderr}"
        return done

    sh(["toren", "init", "hello"], work)
    command = scaffold_install_command(work / "hello")
    assert command == ["pip", "install", "-e", "."]
    # No index has toren-run: the install succeeds only by taking the one installed.
    sh(command, work / "hello")

    # The project is installed, editable, and its toren-run is the checkout's.
    shown = sh(["pip", "show", "hello", "toren-run"], work).stdout
    assert f"Editable project location: {work / 'hello'}" in shown
    assert "Requires: toren-run" in shown
    where = sh(["python", "-c", "import toren; print(toren.__file__)"], work).stdout
    assert where.strip().startswith(str(venv)), f"toren imported from {where}, not the checkout"

    ran = sh(["toren", "run", "hello", "What is the weather in Lyon?"], work)
    assert "✔ completed" in ran.stdout
    assert "This scripted model (script.yaml) always looks up Paris" in ran.stdout
    assert (work / "hello" / ".toren" / "toren.db").is_file()
