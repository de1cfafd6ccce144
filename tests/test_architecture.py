"""The import contracts in pyproject.toml ([tool.importlinter]) hold: the layers point one
way (surfaces > adapters of the engine > core > values and errors) and no package has an
import cycle among its modules or subpackages, counting imports inside functions and under
TYPE_CHECKING. A failure prints the offending imports (file and line)."""

from __future__ import annotations

from pathlib import Path

from importlinter import cli

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_import_contracts_hold() -> None:
    status = cli.lint_imports(config_filename=str(PYPROJECT), no_cache=True, no_logo=True)
    assert status == cli.EXIT_STATUS_SUCCESS, "import contracts broken: see the report above"
