"""The import contracts in pyproject.toml ([tool.importlinter]) hold: the layers point one
way (surfaces > adapters of the engine > core > values and errors) and no package has an
import cycle among its modules or subpackages, counting imports inside functions and under
TYPE_CHECKING. A failure prints the offending imports (file and line). And the store has
one door: no SQL statement and no use of the store's privates outside ``toren/store``
(scanned here, as import-linter sees modules, not names or attributes)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from importlinter import cli

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_import_contracts_hold() -> None:
    status = cli.lint_imports(config_filename=str(PYPROJECT), no_cache=True, no_logo=True)
    assert status == cli.EXIT_STATUS_SUCCESS, "import contracts broken: see the report above"


# -- one door to the store: no SQL and no store privates outside toren.store -----------

SRC = Path(__file__).resolve().parents[1] / "src" / "toren"
# Statements, not prose: the keywords in capitals, as every statement in store/ spells them.
SQL = re.compile(
    r"\bSELECT\b.+?\bFROM\b|\bSELECT\s+\w+\s*\(|\bINSERT\s+INTO\b|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b"
    r"|\b(?:CREATE|ALTER|DROP)\s+(?:TABLE|INDEX|DATABASE|SCHEMA|SEQUENCE|VIEW)\b"
    r"|\bON\s+CONFLICT\b|\bRETURNING\s+\w",
    re.S,
)


def _outside_store(root: Path) -> list[Path]:
    return [p for p in sorted(root.rglob("*.py")) if "store" not in p.relative_to(root).parts]


def _literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string literal with its line; an f-string's constant parts joined (a
    placeholder where a value goes), so a statement built with one is still seen."""
    found: list[tuple[int, str]] = []
    parts_of_fstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "x"
                for v in node.values
            )
            parts_of_fstrings.update(id(v) for v in node.values)
            found.append((node.lineno, text))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in parts_of_fstrings
        ):
            found.append((node.lineno, node.value))
    return found


def sql_outside_store(root: Path) -> list[str]:
    """``file:line: statement`` for each SQL statement in a string literal outside
    ``store/`` under ``root``."""
    hits = []
    for path in _outside_store(root):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, text in _literals(tree):
            match = SQL.search(text)
            if match:
                hits.append(f"{path.relative_to(root)}:{line}: {match.group(0)[:60]!r}")
    return sorted(hits)


def _private(name: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in name.split("."))


def _names_a_store(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return isinstance(name, str) and name.lower().endswith("store")


def store_privates_outside_store(root: Path) -> list[str]:
    """``file:line: what`` for each use of the store's privates outside ``store/``: an
    import of a private store module or name, or a private attribute read off a value
    named ``store`` (``store._x``, ``deps.store._run``, ``getattr(store, "_x")``)."""
    hits = []
    for path in _outside_store(root):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        where = path.relative_to(root)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("toren.store"):
                module = node.module or ""
                names = [a.name for a in node.names if _private(a.name)]
                if _private(module) or names:
                    hits.append(f"{where}:{node.lineno}: from {module} import {names}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("toren.store") and _private(alias.name):
                        hits.append(f"{where}:{node.lineno}: import {alias.name}")
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                if _names_a_store(node.value):
                    hits.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr", "hasattr")
                and len(node.args) >= 2
                and _names_a_store(node.args[0])
                and isinstance(node.args[1], ast.Constant)
                and _private(str(node.args[1].value))
            ):
                hits.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return sorted(hits)


def test_no_sql_outside_the_store() -> None:
    hits = sql_outside_store(SRC)
    assert not hits, "SQL outside toren/store (move it into a store method):\n" + "\n".join(hits)


def test_no_store_privates_outside_the_store() -> None:
    hits = store_privates_outside_store(SRC)
    assert not hits, "store privates used outside toren/store:\n" + "\n".join(hits)


def test_the_scans_find_what_they_look_for(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "sql.py").write_text('Q = "SELECT id FROM runs"\n')
    (tmp_path / "cli.py").write_text(
        "from toren.store._pg_conn import Lanes\n"
        "from toren.store.postgres import _MIGRATION_LOCK\n"
        'PRUNE = f"DELETE FROM runs WHERE id = {1}"\n'
        'NOTE = "Select the runs from the list, then update the view."\n'
        "async def go(store, deps):\n"
        "    await store._run(None)\n"
        "    deps.store._x(None, 'x')\n"
        "    getattr(store, '_on_thread')\n"
        "    return store.__class__\n"
        'GRANT = "SELECT setval(pg_get_serial_sequence(?, ?), ?)"\n'
    )
    assert sql_outside_store(tmp_path) == [
        "cli.py:10: 'SELECT setval('",
        "cli.py:3: 'DELETE FROM'",
    ]
    assert [h.split(": ", 1)[0] for h in store_privates_outside_store(tmp_path)] == [
        "cli.py:1",
        "cli.py:2",
        "cli.py:6",
        "cli.py:7",
        "cli.py:8",
    ]
