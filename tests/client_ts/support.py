"""Running the TypeScript client's npm scripts from pytest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.client_ts.openapi import PACKAGE

NPM_QUIET = {
    "npm_config_fund": "false",
    "npm_config_audit": "false",
    "npm_config_update_notifier": "false",
    "npm_config_loglevel": "warn",
}


def node_and_npm() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node and npm:
        return node, npm
    missing = " and ".join(n for n, p in (("node", node), ("npm", npm)) if not p)
    if os.environ.get("CI") == "true":
        pytest.fail(
            f"{missing} not found: the TypeScript client's tests need Node.js >= 20 and npm"
        )
    pytest.skip(f"{missing} not found: the TypeScript client's tests need Node.js >= 20 and npm")


def npm(*args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOREN_")}
    env.update(NPM_QUIET, TOREN_PYTHON=sys.executable)
    done = subprocess.run(
        [node_and_npm()[1], *args],
        cwd=PACKAGE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (
        f"npm {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-20000:]}\n{done.stderr[-5000:]}"
    )


def installed() -> bool:
    """``node_modules`` matches the lockfile (npm's own record of the last install)."""
    record = PACKAGE / "node_modules" / ".package-lock.json"
    lock = PACKAGE / "package-lock.json"
    return record.exists() and record.stat().st_mtime >= lock.stat().st_mtime


def ensure_installed() -> None:
    """``npm ci`` from the committed lockfile unless ``node_modules`` already matches it."""
    if not installed():
        npm("ci")


_built = False


def ensure_built() -> None:
    """``npm run build`` (the package's ``dist/``) once per test process. Every test that
    reads ``dist/`` is in the xdist group ``clients_typescript``, so they run one after
    another in one process, and none of them changes ``src/``: building it again for each
    (``tsc``, seconds on a small machine) would build the same files."""
    global _built
    ensure_installed()
    if not _built:
        npm("run", "build")
        _built = True
