"""compose.yaml: checked by a real Compose implementation, the Compose Specification's JSON
schema, and by what Toren needs of it (services, healthchecks, start order, environment)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from toren.adapters.docker import render_project_compose

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose.yaml"
INSTALL = "apt-get install -y docker-compose"


def _missing(what: str) -> None:
    message = f"{what} is not installed; CI installs it with: {INSTALL}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def docker_compose() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        _missing("docker-compose (a Compose implementation that checks config without an engine)")
    assert exe is not None
    return exe


@pytest.fixture(scope="module")
def compose_spec_schema(docker_compose: str) -> dict[str, Any]:
    """The Compose Specification schema that the installed docker-compose package ships."""
    shebang = Path(docker_compose).read_text(errors="replace").splitlines()[0]
    interpreter = shebang.removeprefix("#!").split()
    locate = "import compose.config, pathlib; print(pathlib.Path(compose.config.__file__).parent)"
    found = subprocess.run(
        [*interpreter, "-c", locate], capture_output=True, text=True, check=False
    )
    schema = Path(found.stdout.strip()) / "compose_spec.json"
    if found.returncode != 0 or not schema.is_file():
        _missing(f"compose_spec.json (from the docker-compose package; {found.stderr.strip()})")
    loaded: dict[str, Any] = json.loads(schema.read_text())
    return loaded


def _compose_config(
    exe: str, text: str, tmp_path: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "compose.yaml").write_text(text)
    clean_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env}
    return subprocess.run(
        [exe, "--project-directory", str(project), "-f", str(project / "compose.yaml"), "config"],
        cwd=project,
        env=clean_env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def test_repo_compose_is_the_one_toren_init_writes() -> None:
    assert COMPOSE.read_text() == render_project_compose()


def test_docker_compose_config_accepts_it(docker_compose: str, tmp_path: Path) -> None:
    result = _compose_config(docker_compose, COMPOSE.read_text(), tmp_path, TOREN_API_TOKEN="t0k")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert set(resolved["services"]) == {"db", "worker", "api"}
    env = resolved["services"]["api"]["environment"]
    assert env["TOREN_API_TOKEN"] == "t0k"
    assert env["TOREN_DATABASE_URL"] == "postgresql://toren:toren@db:5432/toren"
    assert resolved["services"]["worker"]["deploy"]["replicas"] == 2


def test_docker_compose_config_requires_an_api_token(docker_compose: str, tmp_path: Path) -> None:
    result = _compose_config(docker_compose, COMPOSE.read_text(), tmp_path)
    assert result.returncode != 0
    assert "TOREN_API_TOKEN" in result.stderr


def test_docker_compose_config_rejects_a_broken_file(docker_compose: str, tmp_path: Path) -> None:
    # Proves the check above is a real one: an unknown depends_on condition fails it.
    broken = COMPOSE.read_text().replace("service_healthy", "service_sick")
    assert broken != COMPOSE.read_text()
    result = _compose_config(docker_compose, broken, tmp_path, TOREN_API_TOKEN="t")
    assert result.returncode != 0
    assert "service_sick" in result.stderr


def test_compose_matches_the_compose_spec_schema(
    compose: dict[str, Any], compose_spec_schema: dict[str, Any]
) -> None:
    validator = jsonschema.Draft7Validator(compose_spec_schema)
    errors = sorted(validator.iter_errors(compose), key=str)
    assert errors == []


def test_the_schema_check_can_fail(
    compose: dict[str, Any], compose_spec_schema: dict[str, Any]
) -> None:
    bad = json.loads(json.dumps(compose))
    bad["services"]["db"]["healthcheck"]["retries"] = "many"
    bad["services"]["api"]["restart_policy"] = "always"
    validator = jsonschema.Draft7Validator(compose_spec_schema)
    assert len(list(validator.iter_errors(bad))) >= 2


def test_postgres_has_a_named_volume_and_a_pg_isready_healthcheck(compose: dict[str, Any]) -> None:
    db = compose["services"]["db"]
    assert db["image"] == "postgres:15"
    volume, _, target = db["volumes"][0].partition(":")
    assert target == "/var/lib/postgresql/data"
    assert volume in compose["volumes"], "the data volume must be a named volume"
    test = db["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL" and test[1].startswith("pg_isready ")
    assert db["environment"]["POSTGRES_DB"] == "toren"
    assert "ports" not in db, "PostgreSQL must not be published on the host"


def test_two_workers_and_the_api_wait_for_a_healthy_database(compose: dict[str, Any]) -> None:
    services = compose["services"]
    worker, api = services["worker"], services["api"]
    assert worker["command"] == ["worker"]
    assert worker["deploy"]["replicas"] == 2
    assert api["command"] == ["serve", "--host", "0.0.0.0", "--port", "8080"]
    for name in ("worker", "api"):
        assert services[name]["depends_on"] == {"db": {"condition": "service_healthy"}}, name
    assert api["healthcheck"]["test"] == [
        "CMD",
        "python",
        "-m",
        "toren.adapters.docker",
        "healthcheck",
    ]
    assert api["ports"] == ["127.0.0.1:${TOREN_API_PORT:-8080}:8080"]


def test_configuration_comes_from_the_environment(compose: dict[str, Any]) -> None:
    for name in ("worker", "api"):
        env = compose["services"][name]["environment"]
        assert env["TOREN_DATABASE_URL"].startswith("postgresql://toren:")
        assert env["TOREN_DATABASE_URL"].endswith("@db:5432/toren")
        assert re.fullmatch(r"\$\{TOREN_API_TOKEN:\?[^}]+\}", env["TOREN_API_TOKEN"]), name
        # No value: passed through from the host when set, left unset otherwise.
        assert env["OPENAI_API_KEY"] is None and env["ANTHROPIC_API_KEY"] is None


def test_no_mutable_latest_image(compose: dict[str, Any]) -> None:
    assert ":latest" not in COMPOSE.read_text()
    for name, service in compose["services"].items():
        image = service["image"]
        assert ":" in image.replace("${", "").rsplit("}", 1)[-1] or "${" in image, name
