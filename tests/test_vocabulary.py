"""Every status, step kind and invalidation cause the stores' SQL, the HTTP API, the CLI,
the client and the engine (``toren.core``) use is one of ``toren.core.contract.values``: one place
to change. (The console's scripts are checked in tests/console/test_vocabulary.py.)"""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import tokenize
import typing
from collections import Counter
from pathlib import Path
from typing import Any

import click
import pytest

import toren.store
from toren.api import models
from toren.cli import _common, retention, runs
from toren.client import _types as client_types
from toren.core.contract import records
from toren.core.contract.digest import request_digest
from toren.core.contract.events import Event, ModelCallRecorded, StreamInvalidated, make_event
from toren.core.contract.journal import Journal, Supersede
from toren.core.contract.jsontext import PLAIN, plain_kind
from toren.core.contract.model_types import ModelRequest
from toren.core.contract.values import (
    IN_FLIGHT_STATUSES,
    STATUSES,
    TERMINAL_STATUSES,
    InvalidationCause,
    RunStatus,
    StepKind,
    TickStatus,
    VerdictState,
    vocabulary,
)
from toren.core.drivers import plan, tickstate
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


# -- the engine (toren.core) ------------------------------------------------------------

CORE_WORDS = (
    VALUES
    | CAUSES
    | {k.value for k in StepKind}
    | {t.value for t in TickStatus}
    | set(typing.get_args(VerdictState))
)
# Where core spells a word of the vocabulary that is not the vocabulary, per (file, word)
# exactly how often: a new bare use, or one of these going, fails the test below.
NOT_THE_VOCABULARY = Counter(
    {
        # A model request body's keys ("provider", "model", "params"), in tuples.
        ("core/contract/changes.py", "model"): 2,
        # Change.part: a part of a request that changed (a message, a tool), not a kind.
        ("core/contract/changes.py", "message"): 1,
        ("core/contract/changes.py", "tool"): 4,
        # The "message" key of a recorded error, and a label in a tampered-log note.
        ("core/drivers/effects.py", "message"): 1,
        ("core/contract/recorded.py", "message"): 1,
        # The payload fields a response digest covers (an event's "error" field).
        ("core/contract/audit.py", "error"): 2,
    }
)


def _keys(tree: ast.AST) -> set[int]:
    """The string constants of ``tree`` that are keys, not values: dict keys, subscripts,
    the key of ``.get``/``.pop``/``.setdefault``, an attribute's name, and the four ``Final[VerdictState]``
    constants of core/agent_api/branches.py (mypy holds those to the ``Literal``)."""
    keys: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys.update(id(k) for k in node.keys if k is not None)
        elif isinstance(node, ast.Subscript):
            keys.add(id(node.slice))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and node.args
        ):
            keys.add(id(node.args[0]))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in ("getattr", "hasattr")
            and len(node.args) > 1
        ):
            keys.add(id(node.args[1]))  # an attribute's name
        elif (
            isinstance(node, ast.AnnAssign)
            and node.value is not None
            and "VerdictState" in ast.unparse(node.annotation)
        ):
            keys.add(id(node.value))
    return keys


def test_the_engine_spells_no_status_kind_or_cause() -> None:
    """Statuses, tick statuses, step kinds, invalidation causes and verdict states in
    toren.core are the enums of toren.core.contract.values (values.py defines them)."""
    found: Counter[tuple[str, str]] = Counter()
    for path in sorted((SRC / "core").rglob("*.py")):
        if path.name == "values.py":
            continue
        tree = ast.parse(path.read_text("utf-8"))
        keys = _keys(tree)
        where = path.relative_to(SRC).as_posix()
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in CORE_WORDS
                and id(node) not in keys
            ):
                found[(where, node.value)] += 1
    assert found == NOT_THE_VOCABULARY


def test_the_engine_types_what_it_decides_with_the_enums() -> None:
    hints = typing.get_type_hints
    assert hints(tickstate.TickResult)["status"] is TickStatus
    assert hints(records.Release)["status"] is RunStatus
    assert hints(plan.StreamFinding)["cause"] is InvalidationCause
    assert plan.plan_runs.__kwdefaults__["statuses"] is IN_FLIGHT_STATUSES


def test_what_the_engine_writes_holds_plain_strings() -> None:
    """The enums type the code; the log keeps its plain strings, so payloads and digests
    take the JSON fast paths (exact types only) and keep their bytes."""
    first = make_event("r", ModelCallRecorded(cost_usd="0"), stream="main", position=0)
    first = Event(**{**first.__dict__, "digest": "d0", "seq": 1})
    answer = Journal.fold("r", [first]).request("main", 0, StepKind.TOOL, "d1", code_version="B")
    assert isinstance(answer, Supersede)
    payload = answer.payload.__dict__
    assert plain_kind(payload) == PLAIN, {k: type(v) for k, v in payload.items()}
    assert (payload["expected_kind"], payload["actual_kind"]) == ("model", "tool")
    assert payload["cause"] == "kind_mismatch"
    body = {"name": "t", "args": {}}
    assert request_digest(StepKind.TOOL, body) == request_digest("tool", body)  # type: ignore[arg-type]


def test_frozen_skips_no_check() -> None:
    """``frozen(...)`` builds without ``__init__``: only for classes that check nothing
    there (ctx.model builds its ModelRequest so; see core/agent_api/context.py). The write path
    builds its payloads with their constructors."""
    assert not hasattr(ModelRequest, "__post_init__")
    assert dataclasses.is_dataclass(ModelRequest)
    uses = Counter()
    for path in sorted((SRC / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "frozen":
                built = node.args[0]
                uses[(path.name, ast.unparse(built))] += 1
    # ctx.model's request, and the read path (a recorded response read back).
    assert uses == Counter(
        {
            ("context.py", "ModelRequest"): 1,
            ("model_types.py", "cls"): 1,
            ("model_types.py", "Usage"): 1,
        }
    )
