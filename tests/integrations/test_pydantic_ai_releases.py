"""The integration under a second pydantic-ai release: the oldest of the supported range
(pyproject.toml's `pydantic-ai` extra), installed from the registry into a virtualenv
that sees everything else of this environment. The golden digests must come out the
same (a release that sends the same request keeps the same digest), and the end-to-end
tests must pass, on SQLite (the PostgreSQL half runs under the newest release)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

ROOT = Path(__file__).parents[2]
OLDEST = "2.60.0"  # the lower bound of the `pydantic-ai` extra in pyproject.toml


def test_the_extra_names_the_oldest_release() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'pydantic-ai = ["pydantic-ai-slim[openai,anthropic]>={OLDEST},<3"]' in pyproject


@pytest.mark.slow  # a virtualenv, a release installed, a pytest run in it
def test_the_oldest_supported_release(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"pydantic-ai-slim[openai,anthropic]=={OLDEST}",
        ],
        capture_output=True,
        text=True,
    )
    if installed.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"could not install pydantic-ai-slim {OLDEST}: {installed.stderr[-2000:]}")
        pytest.skip(f"pydantic-ai-slim {OLDEST} cannot be installed here (no registry?)")
    version = subprocess.run(
        [str(python), "-c", "import pydantic_ai; print(pydantic_ai.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == OLDEST
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)  # CI's (durations, ...) are for the outer run
    tests = subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-o",
            "addopts=",  # the project's addopts ask for xdist, which this venv lacks
            "-k",
            "sqlite or not postgres",
            str(ROOT / "tests/integrations/test_pydantic_ai_digest.py"),
            str(ROOT / "tests/integrations/test_pydantic_ai.py"),
            str(ROOT / "tests/integrations/test_pydantic_ai_errors.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    summary = tests.stdout.strip().splitlines()[-1]  # "N passed in Xs" (its last line)
    assert " passed" in summary and " failed" not in summary, summary
