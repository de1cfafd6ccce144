"""Property-based conformance: schemathesis generates requests from the published OpenAPI
document (valid and invalid ones) against a real server; no 5xx, no response off-schema."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import requests
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

import toren
from toren.api import ThreadedServer, create_app
from toren.store import connect

from .support import TOKEN, registry, worker

AUTH = {"Authorization": f"Bearer {TOKEN}"}
# The operations whose schema-valid requests may still be invalid, and how their 422 says
# so: a schedule's cron expression, time zone and interval are strings and numbers whose
# validity (a cron field in range, a range not reversed, a zone that exists, an interval
# of whole seconds) JSON Schema cannot state, nor a backfill's "end after start". The API
# answers those with a 422 naming the field, as it should; for these operations, and a
# 422 that says so, "valid data accepted" does not apply.
SEMANTIC_422 = {
    ("POST", "/v1/schedules"): (
        "body.cron",
        "body.every",
        "body.zone",
        "body.jitter",
        "body.catch_up_window",
        "body: cron/every",
    ),
    ("POST", "/v1/schedules/{agent}/{name}/backfill"): (
        "a backfill needs its end after",
        "a backfill of more than",
    ),
}
EXAMPLES = 10  # per operation and mode: bounded, a few seconds in all
CLI_EXAMPLES = 5  # per operation and phase of the CLI run: about a minute per backend


def app_factory(db_url: str) -> contextlib.AbstractAsyncContextManager[FastAPI]:
    @contextlib.asynccontextmanager
    async def build() -> AsyncIterator[FastAPI]:
        store = await connect(db_url)
        hub = toren.LiveHub()
        try:
            async with worker(store, hub) as runtime:
                yield create_app(
                    store, registry(), tokens=[TOKEN], live=hub, runtime=runtime, heartbeat=0.2
                )
        finally:
            await store.close()

    return build()


# schemathesis's strategies call `random` inside Hypothesis, which warns (an error under
# filterwarnings=error) at random: a fault of the harness, not of the API under test.
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_openapi_conformance(db_url: str) -> None:
    with ThreadedServer(lambda: app_factory(db_url)) as server:
        with httpx.Client(base_url=server.url, headers=AUTH) as http:
            # Seed a finished run so that some generated ids and filters hit real data.
            http.post("/v1/runs", json={"agent": "echo", "input": {"n": 1}}).raise_for_status()
            doc = http.get("/v1/openapi.json").json()
        schema = schemathesis.openapi.from_dict(doc)
        statuses: Counter[int] = Counter()
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 12
        with requests.Session() as session:  # keep-alive: the run stays a few seconds
            session.headers.update(AUTH)
            for operation in operations:
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                    exercise(operation, mode, server.url, session, statuses)
    # The token was sent (not a run of 401s), and real work was done.
    assert statuses[401] == 0, statuses
    assert statuses[200] and statuses[404] and statuses[422], statuses


def exercise(
    operation: schemathesis.APIOperation,
    mode: GenerationMode,
    url: str,
    session: requests.Session,
    statuses: Counter[int],
) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=url, session=session, timeout=10)
        statuses[response.status_code] += 1
        assert response.status_code < 500, (case.method, case.path, response.text)
        excluded = []
        words = SEMANTIC_422.get((case.method, case.path), ())
        if response.status_code == 422 and _says(response.text, words):
            from schemathesis.specs.openapi.checks import positive_data_acceptance

            excluded.append(positive_data_acceptance)
        case.validate_response(response, excluded_checks=excluded)

    try:
        run()
    except Unsatisfiable:
        assert mode is GenerationMode.NEGATIVE  # nothing to get wrong (no parameters)
    except Exception as exc:  # name the operation in the failure
        pytest.fail(f"{operation.label} [{mode.value}]: {exc}")


def _says(text: str, words: tuple[str, ...]) -> bool:
    """An error body whose message says one of ``words``."""
    try:
        message = str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return False
    return any(word in message for word in words)


@pytest.mark.slow
def test_every_check_of_the_schemathesis_cli_passes(db_url: str, tmp_path: Path) -> None:
    """The whole API through schemathesis's own runner, every check it has (schema,
    status codes, headers, content types, SSE events against their schema, OPTIONS/405
    ``Allow`` against the routes, negative data rejected, positive accepted, auth
    ignored, ...) and every phase (examples, coverage, fuzzing, stateful), with the token:
    no failure. ``max_response_time`` is not among them: wall-clock is not a contract here.
    Deterministic and bounded (a fixed number of examples)."""
    exe = shutil.which("schemathesis")
    assert exe is not None, "schemathesis is a test dependency"
    with ThreadedServer(lambda: app_factory(db_url)) as server:
        with httpx.Client(base_url=server.url, headers=AUTH) as http:
            http.post("/v1/runs", json={"agent": "echo", "input": {"n": 1}}).raise_for_status()
        report = tmp_path / "report.json"
        # See SEMANTIC_422: the one operation for which a 422 answers schema-valid data.
        (tmp_path / "schemathesis.toml").write_text(
            "".join(
                "[[operations]]\n"
                f'include-path = "{path}"\n'
                f'include-method = "{method}"\n'
                "[operations.checks.positive_data_acceptance]\n"
                'expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", '
                '"429", "5xx"]\n'
                for method, path in SEMANTIC_422
            )
        )
        result = subprocess.run(
            [
                exe,
                "run",
                f"{server.url}/v1/openapi.json",
                "--header",
                f"Authorization: Bearer {TOKEN}",
                "--checks",
                "all",
                "--max-examples",
                str(CLI_EXAMPLES),
                "--generation-deterministic",
                "--request-timeout",
                "20",
                "--no-color",
                "--report",
                "ndjson",
                "--report-ndjson-path",
                str(report),
            ],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=tmp_path,  # its caches (.schemathesis/) go there, not into the checkout
        )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    summary = result.stdout.rpartition("SUMMARY")[2]
    assert "Failures:" not in summary and " passed" in summary, summary
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in summary, summary
    assert report.stat().st_size > 0 and json.loads(report.read_text().splitlines()[0])
