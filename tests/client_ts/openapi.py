"""The OpenAPI document the TypeScript client's types are generated from.

``python -m tests.client_ts.openapi`` (from the repository root, with ``PYTHONPATH=src``)
writes the current document to ``clients/typescript/openapi.json`` and regenerates
``clients/typescript/src/generated/openapi.ts`` from it with openapi-typescript. The test
next to this module fails when either file is stale."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import toren
from toren.api import create_app
from toren.store import open_store

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "typescript"
DOCUMENT = PACKAGE / "openapi.json"
GENERATED = PACKAGE / "src" / "generated" / "openapi.ts"


def current_document() -> dict[str, Any]:
    """The document the API serves at ``/v1/openapi.json`` (it does not depend on the
    store, the agents or the tokens: the app is built over an empty SQLite database)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{tmp}/openapi.db")
        app = create_app(store, toren.Registry(), tokens=["unused-token-0123456789"], console=False)
        return app.openapi()


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def generate_types(document: Path, output: Path) -> None:
    """openapi-typescript (the package's pinned devDependency) from ``document`` to
    ``output``; the package's dependencies must be installed (``npm ci``)."""
    binary = PACKAGE / "node_modules" / ".bin" / "openapi-typescript"
    subprocess.run(
        [str(binary), str(document), "--output", str(output)],
        cwd=PACKAGE,
        check=True,
        capture_output=True,
        text=True,
    )


def main() -> None:
    DOCUMENT.write_text(render(current_document()), encoding="utf-8")
    GENERATED.parent.mkdir(parents=True, exist_ok=True)
    generate_types(DOCUMENT, GENERATED)
    print(f"wrote {DOCUMENT.relative_to(ROOT)} and {GENERATED.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
