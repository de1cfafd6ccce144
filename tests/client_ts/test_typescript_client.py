"""The TypeScript client (``clients/typescript``, the npm package ``@toren-run/client``)
inside the Python test run, so the README's single test command covers it: its
dependencies installed with ``npm ci`` from the committed lockfile, ``tsc --noEmit`` over
the sources, the tests and the example, then its ``node --test`` suite, which starts real
``toren serve``, ``toren worker`` and ``toren dev`` processes from this checkout.

Without node and npm the suite is skipped, except under ``CI=true`` where it fails
(``.ci/run`` installs them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.client_ts.openapi import DOCUMENT, PACKAGE, current_document, render

NPM_QUIET = {
    "npm_config_fund": "false",
    "npm_config_audit": "false",
    "npm_config_update_notifier": "false",
    "npm_config_loglevel": "warn",
}


def _node_and_npm() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node and npm:
        return node, npm
    missing = " and ".join(n for n, p in (("node", node), ("npm", npm)) if not p)
    if os.environ.get("CI") == "true":
        pytest.fail(
            f"{missing} not found: the TypeScript client's tests need Node.js >= 20 and npm"
        )
    pytest.skip(f"{missing} not found: the TypeScript client's tests need Node.js >= 20 and npm")


def _npm(npm: str, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOREN_")}
    env.update(NPM_QUIET, TOREN_PYTHON=sys.executable)
    done = subprocess.run(
        [npm, *args], cwd=PACKAGE, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (
        f"npm {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-20000:]}\n{done.stderr[-5000:]}"
    )


def _installed() -> bool:
    """``node_modules`` matches the lockfile (npm's own record of the last install)."""
    record = PACKAGE / "node_modules" / ".package-lock.json"
    lock = PACKAGE / "package-lock.json"
    return record.exists() and record.stat().st_mtime >= lock.stat().st_mtime


def test_openapi_document_is_current() -> None:
    """The document the TypeScript types are generated from is the API's, as served now."""
    committed = DOCUMENT.read_text(encoding="utf-8")
    assert json.loads(committed) == current_document(), (
        "clients/typescript/openapi.json is stale: run "
        "`PYTHONPATH=src python -m tests.client_ts.openapi` and commit both files it writes"
    )
    assert committed == render(current_document())


@pytest.mark.timeout(900)
def test_typescript_client() -> None:
    _, npm = _node_and_npm()
    if not _installed():
        _npm(npm, "ci")
    _npm(npm, "run", "typecheck")
    _npm(npm, "test")
