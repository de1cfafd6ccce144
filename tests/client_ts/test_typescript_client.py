"""The TypeScript client (``clients/typescript``, the npm package ``@toren-run/client``)
inside the Python test run, so the README's single test command covers it: its
dependencies installed with ``npm ci`` from the committed lockfile, ``tsc --noEmit`` over
the sources, the tests and the example, then its ``node --test`` suite, which starts real
``toren serve``, ``toren worker`` and ``toren dev`` processes from this checkout.

Without node and npm the suite is skipped, except under ``CI=true`` where it fails
(``.ci/run`` installs them)."""

from __future__ import annotations

import json

import pytest

from tests.client_ts.openapi import DOCUMENT, current_document, render
from tests.client_ts.support import ensure_built, npm

# Both files build the package in clients/typescript (dist/, .build/, node_modules/):
# one process, one after the other, under pytest-xdist.
pytestmark = pytest.mark.xdist_group("clients_typescript")


def test_openapi_document_is_current() -> None:
    """The document the TypeScript types are generated from is the API's, as served now."""
    committed = DOCUMENT.read_text(encoding="utf-8")
    assert json.loads(committed) == current_document(), (
        "clients/typescript/openapi.json is stale: run "
        "`PYTHONPATH=src python -m tests.client_ts.openapi` and commit both files it writes"
    )
    assert committed == render(current_document())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_typescript_client() -> None:
    """``npm test`` in steps: the package's build (shared with the other tests of this
    group), the tests' and the example's build, then ``node --test`` (``--ignore-scripts``
    skips the ``pretest`` that would build both again). ``tsc`` type-checks as it builds:
    the sources under ``tsconfig.build.json`` (no Node types: stricter than ``npm run
    typecheck``), the tests and the example against the built declarations, so the two
    builds check what ``npm run typecheck`` checks (``.ci/run`` no longer runs it apart)."""
    ensure_built()
    npm("run", "build:test")
    npm("test", "--ignore-scripts")
