"""A `toren init` project on Docker Compose for real: its own Dockerfile and compose.yaml,
Toren installed from a wheel of this checkout (``wheels/`` plus the ``TOREN_WHEEL`` build
argument, as the project's Dockerfile and docs/deploy.md describe), `up -d`, one run
completes. Host networking and stand-in base images as in test_compose_upgrade."""

from __future__ import annotations

import secrets
import shutil
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.deploy import dockerkit
from tests.deploy.stack import PUBLISHED_PORT, ComposeStack, stack_env
from toren.cli.project import init

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_toren_init_project_builds_from_a_local_wheel_and_completes_a_run(
    tmp_path: Path, compose_cmd: list[str], base_image: str, postgres_image: str
) -> None:
    project = tmp_path / "weather-bot"
    result = CliRunner().invoke(init, [str(project)])
    assert result.exit_code == 0, result.output
    compose = (project / "compose.yaml").read_text()
    assert compose.count(PUBLISHED_PORT) == 1
    (project / "compose.yaml").write_text(compose.replace(PUBLISHED_PORT, ""))
    shutil.copy(dockerkit.ASSETS / "compose.test.yaml", project / "compose.test.yaml")
    wheel = dockerkit.build_wheel(project / "wheels")

    name = f"toreninit{uuid.uuid4().hex[:8]}"
    api_port, pg_port = dockerkit.free_port(), dockerkit.free_port()
    token = secrets.token_urlsafe(32)
    env = stack_env(
        TOREN_API_TOKEN=token,
        TOREN_API_PORT=str(api_port),
        TOREN_TEST_PG_PORT=str(pg_port),
        TOREN_TEST_POSTGRES_IMAGE=postgres_image,
        TOREN_TEST_PYTHON_IMAGE=base_image,
        # The scripted model needs no server; the override still wants a URL to pass on.
        TOREN_TEST_MODEL_URL="http://127.0.0.1:9/v1",
        TOREN_TEST_WHEEL=wheel.name,
        TOREN_IMAGE=f"{name}:1",
    )
    stack = ComposeStack(compose_cmd, project, name, env, api_port, token)
    try:
        stack.build(f"{name}:1")
        installed = dockerkit.sh(
            [
                "docker",
                "run",
                "--rm",
                "--network",
                "host",
                "--entrypoint",
                "python",
                f"{name}:1",
                "-c",
                "import importlib.metadata as m, toren; print(m.version('toren-run'), toren.__file__)",
            ]
        ).stdout.split()
        assert installed[0] == wheel.name.split("-")[1]
        assert installed[1].startswith("/opt/toren/")
        stack.up(f"{name}:1")
        stack.wait_healthy(f"{name}:1")
        assert len(stack.containers("worker")) == 2
        with stack.client() as client:
            run = client.start_run("weather-bot", "What is the weather in Paris?")
        done = stack.wait_run(run.id, lambda r: r.terminal, "the run to finish", 180)
        assert done.status == "completed", done.error
        assert "Paris" in str(done.output)
    except BaseException:
        print(stack.logs())  # pytest shows it with the failure
        raise
    finally:
        stack.run("down", "--volumes", "--remove-orphans", "--timeout", "5", check=False)
        dockerkit.sh(["docker", "image", "rm", "-f", f"{name}:1"], check=False)
