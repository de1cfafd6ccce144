"""Every status, step kind and invalidation cause the stores' SQL, the HTTP API, the CLI
and the client use is one of ``toren.core.values``: one place to change. (The console's
scripts are checked in tests/console/test_vocabulary.py.)"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path
from typing import Any

import click
import pytest

import toren.store
from toren.api import models
from toren.cli import _common, retention, runs
from toren.client import _types as client_types
from toren.core.events import StreamInvalidated
from toren.core.values import (
    IN_FLIGHT_STATUSES,
    STATUSES,
    TERMINAL_STATUSES,
    InvalidationCause,
    RunStatus,
    StepKind,
    TickStatus,
    vocabulary,
)
from toren.store.schema import SCHEMA, CreateTable

SRC = Path(toren.store.__file__).resolve().parents[1]
VALUES = {s.value for s in STATUSES}
CAUSES = {c.value for c in InvalidationCause}

# ``status = 'x'``, ``status IN ('x', 'y')``, ``status NOT IN (...)`` in SQL text.
_SQL_STATUS = re.compile(r"status\s*(?:=|<>|!=|(?:NOT\s+)?IN)\s*(\([^)]*\)|'[^']*')", re.I)


def _sql_statuses(text: str) -> list[str]:
    return [w for m in _SQL_STATUS.finditer(text) for w in re.findall(r"'([^']*)'", m.group(1))]


def test_the_sets_hang_together() -> None:
    assert TERMINAL_STATUSES < VALUES
    assert set(IN_FLIGHT_STATUSES) == VALUES - TERMINAL_STATUSES
    assert all(RunStatus[s.name].terminal == (s in TERMINAL_STATUSES) for s in STATUSES)
    # A tick that ends a run ends it with the run's status, spelled the same.
    for status in RunStatus:
        assert TickStatus[status.name] == status
    assert len({k.value for k in StepKind}) == len(StepKind)


@pytest.mark.parametrize("module", ["sql.py", "sqlite.py", "postgres.py", "retention.py"])
def test_sql_names_only_known_statuses(module: str) -> None:
    text = (SRC / "store" / module).read_text("utf-8")
    found = _sql_statuses(text)
    assert set(found) <= VALUES, sorted(set(found) - VALUES)
    if module in ("sql.py", "postgres.py"):
        assert found  # the pattern still matches how the statements are written


def test_schema_default_status_is_queued() -> None:
    runs_table = next(s for s in SCHEMA if isinstance(s, CreateTable) and s.table == "runs")
    status = next(c for c in runs_table.columns if c.name == "status")
    assert status.default == f"'{RunStatus.QUEUED}'"


def test_python_in_the_edges_spells_no_status_or_cause() -> None:
    """The store, the API, the CLI and the client compare with the enums; a bare
    ``"failed"`` there would be a second spelling (SQL text is checked above)."""
    words = VALUES | CAUSES
    prose = {("cli/view.py", '"failed"')}  # "child failed": English, not a run's status
    found = []
    for folder in ("store", "api", "cli", "client", "console"):
        for path in sorted((SRC / folder).glob("*.py")):
            tokens = tokenize.generate_tokens(io.StringIO(path.read_text("utf-8")).readline)
            for tok in tokens:
                if tok.type != tokenize.STRING or tok.string[0] not in "\"'":
                    continue  # f-strings and prefixed literals hold no bare status
                where = (path.relative_to(SRC).as_posix(), tok.string)
                if ast.literal_eval(tok.string) in words and where not in prose:
                    found.append(f"{where[0]}:{tok.start[0]} {tok.string}")
    assert found == []


def test_api_models_use_the_enums() -> None:
    assert models.Run.model_fields["status"].annotation is RunStatus
    assert models.RunPlan.model_fields["status"].annotation is RunStatus
    cause: Any = models.StreamFinding.model_fields["cause"].annotation
    assert {c.value for c in cause.__args__} <= CAUSES


def test_openapi_document_lists_the_statuses() -> None:
    from tests.client_ts.openapi import current_document

    schemas = current_document()["components"]["schemas"]
    assert schemas["RunStatus"]["enum"] == [s.value for s in STATUSES]
    finding = schemas["StreamFinding"]["properties"]["cause"]
    assert set(finding["enum"]) <= CAUSES


def test_cli_choices_are_the_statuses() -> None:
    option = next(p for p in runs.list_runs.params if p.name == "status")
    assert isinstance(option.type, click.Choice)
    assert list(option.type.choices) == [s.value for s in STATUSES]
    assert all(type(c) is str for c in option.type.choices)  # click takes members by name
    finished = retention.FINISHED
    assert finished == sorted(TERMINAL_STATUSES)
    assert all(type(c) is str for c in retention.FINISHED)
    assert set(_common.STATUS_EXIT) == TERMINAL_STATUSES
    assert set(runs._STATUS_STYLE) == VALUES


def test_client_and_events_agree() -> None:
    assert client_types.TERMINAL_STATUSES is TERMINAL_STATUSES
    assert client_types.Run(id="r", agent="a").status == RunStatus.QUEUED
    assert StreamInvalidated().cause in CAUSES


def test_vocabulary_is_json_of_the_enums() -> None:
    sets = vocabulary()
    assert sets["RunStatus"] == {s.name: s.value for s in STATUSES}
    assert sets["StepKind"] == {k.name: k.value for k in StepKind}
    assert sets["InvalidationCause"] == {c.name: c.value for c in InvalidationCause}
    assert sets["terminal"] == [s.value for s in STATUSES if s in TERMINAL_STATUSES]
