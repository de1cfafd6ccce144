"""A Compose project under test, and the loopback model server its agents talk to.

:class:`ComposeStack` drives a real Compose implementation (``docker compose`` or
docker-compose v1) on a project directory laid out like a user's: the Dockerfile, the
shipped ``compose.yaml`` and the test override ``compose.test.yaml`` (host networking,
stand-in images, loopback ports). :class:`ModelServer` answers OpenAI chat completions on
127.0.0.1, slowly for the requests a test marks slow, and counts every request it served.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.deploy import dockerkit
from tests.providers.fakes import FAKE_KEY, Completion, render_openai
from toren.client import Event, Run, TorenClient

# compose.yaml publishes the API port; a container on the host's network cannot publish
# ports (it binds the host's port itself), so the test's copy drops exactly these lines
# and the override has the API listen on 127.0.0.1:TOREN_API_PORT instead.
PUBLISHED_PORT = '    ports:\n      - "127.0.0.1:${TOREN_API_PORT:-8080}:8080"\n'


@dataclass(frozen=True)
class Served:
    system: str | None
    user: str


@dataclass
class ModelServer:
    """OpenAI-compatible chat completions on 127.0.0.1; a request whose last user message
    contains ``slow_marker`` is answered after ``latency`` seconds."""

    latency: float
    slow_marker: str = ": slow "
    served: list[Served] = field(default_factory=list)
    arrived: list[Served] = field(default_factory=list)
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def handle(self, request: Request) -> Response:
        body = await request.json()
        messages = body.get("messages", [])
        system = next((m["content"] for m in messages if m.get("role") == "system"), None)
        user = next(m["content"] for m in reversed(messages) if m.get("role") == "user")
        seen = Served(system, user)
        with self._lock:
            self.arrived.append(seen)
        if self.slow_marker in user:
            await asyncio.sleep(self.latency)
        with self._lock:
            self.served.append(seen)
        return render_openai(Completion(text=f"answer to {user}"), body)

    def count(self, user: str, system: str | None = None, *, served: bool = True) -> int:
        with self._lock:
            seen = self.served if served else self.arrived
            return sum(1 for s in seen if s.user == user and (system is None or s.system == system))

    def systems(self, user: str) -> list[str | None]:
        with self._lock:
            return [s.system for s in self.served if s.user == user]


@contextmanager
def serve_model(latency: float) -> Iterator[ModelServer]:
    model = ModelServer(latency=latency)
    app = Starlette(routes=[Route("/v1/chat/completions", model.handle, methods=["POST"])])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    model.port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        dockerkit.wait_for("the loopback model server", lambda: server.started, 10, 0.02)
        yield model
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@dataclass
class ComposeStack:
    compose: list[str]
    directory: Path
    name: str
    env: dict[str, str]
    api_port: int
    token: str

    def run(self, *args: str, timeout: float = 600, check: bool = True, **env: str) -> str:
        argv = [*self.compose, "-p", self.name, "-f", "compose.yaml", "-f", "compose.test.yaml"]
        result = dockerkit.sh(
            [*argv, *args],
            cwd=self.directory,
            env={**self.env, **env},
            timeout=timeout,
            check=check,
        )
        return result.stdout + result.stderr

    def build(self, image: str) -> None:
        self.run("build", "worker", TOREN_IMAGE=image)

    def up(self, image: str) -> None:
        self.run("up", "-d", "--no-build", TOREN_IMAGE=image)

    def logs(self) -> str:
        return self.run("logs", "--no-color", "--tail", "60", check=False, timeout=120)

    def containers(self, service: str) -> list[dict[str, Any]]:
        """`docker inspect` of the service's running containers."""
        import json

        ids = dockerkit.sh(
            [
                "docker",
                "ps",
                "-q",
                "--filter",
                f"label=com.docker.compose.project={self.name}",
                "--filter",
                f"label=com.docker.compose.service={service}",
            ]
        ).stdout.split()
        if not ids:
            return []
        found: list[dict[str, Any]] = json.loads(dockerkit.sh(["docker", "inspect", *ids]).stdout)
        return found

    def client(self, token: str | None = "use-own") -> TorenClient:
        return TorenClient(
            f"http://127.0.0.1:{self.api_port}", token=self.token if token == "use-own" else token
        )

    def wait_run(self, run_id: str, check: Callable[[Run], bool], what: str, timeout: float) -> Run:
        def probe() -> Run | None:
            with self.client() as client:
                run = client.get_run(run_id)
            return run if check(run) else None

        try:
            found = dockerkit.wait_for(what, probe, timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- compose logs\n{self.logs()}") from None
        assert isinstance(found, Run)
        return found

    def events(self, run_id: str) -> list[Event]:
        out: list[Event] = []
        after = 0
        with self.client() as client:
            while True:
                page = client.events(run_id, after=after, limit=500)
                out += page.events
                if page.next_after is None or not page.events:
                    return out
                after = page.next_after

    def wait_healthy(self, image: str, timeout: float = 180) -> None:
        """The API answers, two workers and one API run ``image``, the db is healthy."""

        def probe() -> bool:
            with self.client() as client:
                client.health()
            db = self.containers("db")
            running = {
                service: [c["Config"]["Image"] for c in self.containers(service)]
                for service in ("worker", "api")
            }
            return (
                bool(db)
                and db[0]["State"].get("Health", {}).get("Status") == "healthy"
                and running == {"worker": [image, image], "api": [image]}
            )

        try:
            dockerkit.wait_for("the stack to answer /v1/health", probe, timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- compose logs\n{self.logs()}") from None


def stack_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "DOCKER_HOST")}
    env.update(
        {
            # The classic builder: BuildKit would fetch its Dockerfile frontend from Docker Hub.
            "DOCKER_BUILDKIT": "0",
            "COMPOSE_DOCKER_CLI_BUILD": "0",
            "OPENAI_API_KEY": FAKE_KEY,
        }
    )
    env.update(values)
    return env


def deadline_left(start: float, budget: float) -> float:
    return max(budget - (time.monotonic() - start), 1.0)
