"""The Docker Compose tier for real: build the image, start the stack, upgrade it and roll it
back with runs in flight, exactly as docs/deploy.md tells users to.

Real Docker engine, real Compose, the repository's Dockerfile and compose.yaml, and the
test override ``compose/compose.test.yaml`` (every container on the host's network, so
all traffic stays on 127.0.0.1; PostgreSQL on a free loopback port; the stand-in base
images of ``dockerkit``). The agent (``compose/agent``) calls an OpenAI-compatible model
server on the host, which counts what it was asked: that count is what "not paid again"
means.

The two images are built the way a release pipeline builds them, one tag per version:

- ``v1``, "the previous release": this checkout with the prompts of ``compose/agent`` and
  a schema list that lacks its latest indexes (what a database created by an older release
  looks like);
- ``v2``, "the new release": this checkout as it is, with edited prompts.
"""

from __future__ import annotations

import secrets
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.deploy import dockerkit
from tests.deploy.stack import PUBLISHED_PORT, ComposeStack, ModelServer, serve_model, stack_env
from toren.client import Run, TorenAPIError
from toren.store.schema import SCHEMA, AddColumn, CreateIndex, applies

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

AGENT = "upgrade-agent"
GREETING = {"v1": "Greet the customer by name.", "v2": "Greet the customer warmly, by name."}
FINAL = {"v1": "Summarise the work in one line.", "v2": "Summarise the work in two lines."}
SLOW_LATENCY = 8.0  # seconds the loopback model takes for each slow step (room for `up -d`)
RUN_TIMEOUT = 180.0


def newest_indexes() -> list[str]:
    """The non-unique PostgreSQL indexes appended to the schema after its first tables (the
    part of the list a previous release would not have had); dropping them changes no
    behaviour. An index of another dialect only (SQLite's ``runs_list``) never appears on
    the stack's PostgreSQL, so it cannot show a migration."""
    first_added = next(n for n, m in enumerate(SCHEMA) if isinstance(m, AddColumn))
    names = [
        m.name
        for m in SCHEMA[first_added:]
        if isinstance(m, CreateIndex) and not m.unique and applies(m, "postgres")
    ]
    assert names, "the schema list has no index appended after its first tables to hold back"
    return names


def lay_out_project(directory: Path) -> None:
    """A user's Compose project: this checkout's Dockerfile, compose.yaml and sources, the
    agent under agents/, and the test override."""
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md"):
        shutil.copy(dockerkit.REPO / name, directory / name)
    shutil.copytree(
        dockerkit.REPO / "src",
        directory / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    shutil.copytree(dockerkit.ASSETS / "agent", directory / "agents" / AGENT)
    compose = (dockerkit.REPO / "compose.yaml").read_text()
    assert compose.count(PUBLISHED_PORT) == 1, "compose.yaml's api ports entry changed"
    (directory / "compose.yaml").write_text(compose.replace(PUBLISHED_PORT, ""))
    shutil.copy(dockerkit.ASSETS / "compose.test.yaml", directory / "compose.test.yaml")


def set_release(directory: Path, release: str) -> None:
    prompts = directory / "agents" / AGENT / "prompts"
    (prompts / "greeting.md").write_text(GREETING[release] + "\n")
    (prompts / "final.md").write_text(FINAL[release] + "\n")
    schema = directory / "src" / "toren" / "store" / "schema.py"
    original = (dockerkit.REPO / "src" / "toren" / "store" / "schema.py").read_text()
    if release == "v1":
        held_back = newest_indexes()
        original += (
            "\n\n# The previous release (test build): its list lacks the newest indexes.\n"
            f"SCHEMA = tuple(m for m in SCHEMA if getattr(m, 'name', None) not in {held_back!r})\n"
        )
    schema.write_text(original)


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with serve_model(SLOW_LATENCY) as server:
        yield server


@pytest.fixture
def stack(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    compose_cmd: list[str],
    base_image: str,
    postgres_image: str,
    model: ModelServer,
) -> Iterator[ComposeStack]:
    directory = tmp_path / "project"
    directory.mkdir()
    lay_out_project(directory)
    name = f"torentest{uuid.uuid4().hex[:8]}"
    pg_port, api_port = dockerkit.free_port(), dockerkit.free_port()
    assert 5432 not in (pg_port, api_port)
    token = secrets.token_urlsafe(32)
    env = stack_env(
        TOREN_API_TOKEN=token,
        TOREN_API_PORT=str(api_port),
        TOREN_TEST_PG_PORT=str(pg_port),
        TOREN_TEST_POSTGRES_IMAGE=postgres_image,
        TOREN_TEST_PYTHON_IMAGE=base_image,
        TOREN_TEST_MODEL_URL=model.url,
        TOREN_IMAGE=f"{name}:v1",
    )
    stack = ComposeStack(compose_cmd, directory, name, env, api_port, token)
    failed_before = request.session.testsfailed
    try:
        yield stack
    finally:
        if request.session.testsfailed > failed_before:
            print(stack.logs())  # pytest shows it with the failure
        stack.run("down", "--volumes", "--remove-orphans", "--timeout", "5", check=False)
        for release in ("v1", "v2"):
            dockerkit.sh(["docker", "image", "rm", "-f", f"{name}:{release}"], check=False)


def db_indexes(stack: ComposeStack) -> set[str]:
    url = f"postgresql://toren:toren@127.0.0.1:{stack.env['TOREN_TEST_PG_PORT']}/toren"
    with psycopg.connect(url, connect_timeout=5) as conn:
        rows = conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")
        return {str(r[0]) for r in rows.fetchall()}


def invalidations(stack: ComposeStack, run_id: str) -> list[tuple[str, object, str]]:
    return [
        (e.stream, e.payload.get("from_pos"), e.code_version)
        for e in stack.events(run_id)
        if e.type == "StreamInvalidated"
    ]


def step_versions(stack: ComposeStack, run_id: str) -> dict[int, str]:
    """Position -> code version of the worker that recorded the step's result."""
    return {
        e.position: e.code_version
        for e in stack.events(run_id)
        if e.position is not None and e.stream == "main" and e.type != "StreamInvalidated"
    }


def completed(run: Run) -> bool:
    if run.status in ("failed", "cancelled"):
        raise AssertionError(f"run {run.id} ended {run.status}: {run.error}")
    return run.status == "completed"


def test_upgrade_and_rollback_with_runs_in_flight(stack: ComposeStack, model: ModelServer) -> None:
    started = time.monotonic()
    images = {release: f"{stack.name}:{release}" for release in ("v1", "v2")}
    for release, image in images.items():
        set_release(stack.directory, release)
        stack.build(image)
    held_back = set(newest_indexes())

    # 1. up -d: PostgreSQL healthy, two workers and the API up, the token enforced.
    stack.up(images["v1"])
    stack.wait_healthy(images["v1"])
    assert len(stack.containers("worker")) == 2
    assert len(stack.containers("api")) == 1
    with stack.client(token=None) as anonymous:
        assert anonymous.health()["status"] == "ok"  # public by design: probes have no token
        with pytest.raises(TorenAPIError) as refused:
            anonymous.list_runs()
        assert refused.value.status == 401
    with stack.client(token="wrong-token") as wrong:
        with pytest.raises(TorenAPIError) as refused:
            wrong.list_runs()
        assert refused.value.status == 401
    with stack.client() as client:
        assert client.health()["status"] == "ok"
        assert client.list_runs().runs == []
    assert db_indexes(stack).isdisjoint(held_back), "v1 must not know the newest indexes"

    # 2. One run waits on a message; another is in the middle of slow model steps.
    with stack.client() as client:
        waiting = client.start_run(AGENT, {"topic": "A", "wait": True}).id
        busy = client.start_run(AGENT, {"topic": "B", "slow": 3}).id
    stack.wait_run(waiting, lambda r: r.status == "waiting", "run A to wait", RUN_TIMEOUT)
    dockerkit.wait_for(
        "run B's second slow step to reach the model",
        lambda: model.count("B: slow 1", served=False) == 1,
        RUN_TIMEOUT,
        0.1,
    )
    assert model.count("B: slow 1") == 0, "the upgrade must start while slow 1 is in flight"
    old_version = next(e.code_version for e in stack.events(busy) if e.code_version)

    # 3. Upgrade: `up -d` with the new image replaces API and workers. The old workers
    #    drain (stop_grace_period), the new ones migrate the schema on boot.
    stack.up(images["v2"])
    assert model.count("B: slow 1") == 1, "the step in flight finished before its worker left"
    stack.wait_healthy(images["v2"])
    dockerkit.wait_for(
        f"the new image to migrate the schema (indexes {sorted(held_back)})",
        lambda: held_back <= db_indexes(stack),
        120,
    )
    with stack.client() as client:
        client.send_message(waiting, "approval", "yes")
    runs = {
        run_id: stack.wait_run(run_id, completed, f"run {run_id} to complete", RUN_TIMEOUT)
        for run_id in (waiting, busy)
    }
    new_version = stack.events(busy)[-1].code_version
    assert new_version != old_version
    for run_id, run in runs.items():
        assert run.output["final_prompt"] == FINAL["v2"], run_id  # finished by the new code
        assert stack.events(run_id)[-1].code_version == new_version
    assert runs[waiting].output["approval"] == "yes"

    # Nothing finished was paid again: each slow step (the drained one included) and each
    # final step reached the model exactly once ...
    for i in range(3):
        assert model.count(f"B: slow {i}") == 1, i
    assert model.systems("B: final") == [FINAL["v2"]]
    assert model.systems("A: final") == [FINAL["v2"]]
    # ... except the one step whose prompt changed: run A's greeting, recorded under v1,
    # invalidated once on replay under v2 and run again with the new prompt.
    assert model.systems("A: greet") == [GREETING["v1"], GREETING["v2"]]
    assert invalidations(stack, waiting) == [("main", 0, new_version)]
    assert invalidations(stack, busy) == []
    assert (runs[waiting].invalidations, runs[busy].invalidations) == (1, 0)
    busy_steps = step_versions(stack, busy)
    assert busy_steps[0] == busy_steps[1] == old_version, "slow 0 and 1 were recorded by v1"
    assert busy_steps[2] == new_version

    # 4. Roll back to the previous image with runs started under v2 in flight.
    with stack.client() as client:
        waiting2 = client.start_run(AGENT, {"topic": "C", "wait": True}).id
        busy2 = client.start_run(AGENT, {"topic": "D", "slow": 2}).id
    stack.wait_run(waiting2, lambda r: r.status == "waiting", "run C to wait", RUN_TIMEOUT)
    dockerkit.wait_for(
        "run D's first slow step to reach the model",
        lambda: model.count("D: slow 0", served=False) == 1,
        RUN_TIMEOUT,
        0.1,
    )
    stack.up(images["v1"])
    assert model.count("D: slow 0") == 1
    stack.wait_healthy(images["v1"])
    with stack.client() as client:
        client.send_message(waiting2, "approval", "ok")
    for run_id in (waiting2, busy2):
        run = stack.wait_run(run_id, completed, f"run {run_id} to complete", RUN_TIMEOUT)
        assert run.output["final_prompt"] == FINAL["v1"], run_id
    assert model.count("D: slow 0") == model.count("D: slow 1") == 1
    assert model.systems("C: greet") == [GREETING["v2"], GREETING["v1"]]
    assert len(invalidations(stack, waiting2)) == 1
    assert invalidations(stack, busy2) == []
    # The older code runs on the newer schema: nothing was dropped.
    assert held_back <= db_indexes(stack)

    # down and up keep every run: the database lives in the named volume.
    with stack.client() as client:
        before = {r.id: (r.status, r.output) for r in client.list_runs(limit=100).runs}
    assert set(before) == {waiting, busy, waiting2, busy2}
    stack.run("down")
    assert stack.containers("db") == []
    stack.up(images["v1"])
    stack.wait_healthy(images["v1"])
    with stack.client() as client:
        after = {r.id: (r.status, r.output) for r in client.list_runs(limit=100).runs}
    assert after == before
    assert {status for status, _ in after.values()} == {"completed"}
    print(f"compose upgrade test: {time.monotonic() - started:.0f}s")
