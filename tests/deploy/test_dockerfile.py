"""The image: multi-stage, slim base, no build tools or root in the final stage, a health
check, two process types. Both the repository's Dockerfile and the one `toren init` writes."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from toren.adapters import docker
from toren.adapters.docker import (
    healthcheck,
    render_project_compose,
    render_project_dockerfile,
    render_project_dockerignore,
)

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def parse(text: str) -> list[list[Instruction]]:
    """Dockerfile instructions grouped by stage (line continuations joined)."""
    joined = text.replace("\\\n", " ")
    stages: list[list[Instruction]] = [[]]
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        if keyword.upper() == "FROM":
            stages.append([])
        stages[-1].append(Instruction(keyword.upper(), " ".join(args.split())))
    return stages


DOCKERFILES = {
    "repository": (REPO / "Dockerfile").read_text(),
    "project": render_project_dockerfile(),
}


@pytest.mark.parametrize("name", DOCKERFILES)
def test_multi_stage_on_slim_python_311(name: str) -> None:
    preamble, *stages = parse(DOCKERFILES[name])
    assert len(stages) >= 2
    assert Instruction("ARG", "PYTHON_IMAGE=python:3.11-slim-bookworm") in preamble
    for stage in stages:
        assert stage[0].args.split()[0] == "${PYTHON_IMAGE}"
    assert stages[0][0].args.endswith("AS builder")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_final_stage_has_no_build_tools_and_no_root(name: str) -> None:
    final = parse(DOCKERFILES[name])[-1]
    runs = " ".join(i.args for i in final if i.keyword == "RUN")
    for tool in ("pip install", "python -m build", "apt-get", "gcc", "build-essential"):
        assert tool not in runs, tool
    assert any(i.keyword == "COPY" and i.args.startswith("--from=builder") for i in final)
    users = [i.args for i in final if i.keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    # USER comes before the process starts, after the last file-system change.
    keywords = [i.keyword for i in final]
    assert keywords.index("USER") > max(n for n, k in enumerate(keywords) if k in ("RUN", "COPY"))


@pytest.mark.parametrize("name", DOCKERFILES)
def test_two_process_types_and_a_healthcheck(name: str) -> None:
    final = {i.keyword: i.args for i in parse(DOCKERFILES[name])[-1]}
    assert json.loads(final["ENTRYPOINT"]) == ["toren"]
    assert json.loads(final["CMD"]) == ["worker"]
    assert final["EXPOSE"] == "8080"
    check = final["HEALTHCHECK"]
    assert check.split(" CMD ", 1)[1] == json.dumps(
        ["python", "-m", "toren.adapters.docker", "healthcheck"]
    )


def test_repository_image_builds_the_wheel_from_source() -> None:
    builder = parse(DOCKERFILES["repository"])[1]
    runs = [i.args for i in builder if i.keyword == "RUN"]
    assert any("python -m build --wheel" in r for r in runs)
    assert any("toren_run-*.whl)[postgres]" in r for r in runs)


def test_project_image_installs_toren_run_from_pypi_and_copies_the_agent() -> None:
    stages = parse(DOCKERFILES["project"])
    builder_runs = " ".join(i.args for i in stages[1] if i.keyword == "RUN")
    assert 'pip install "toren-run[postgres]>=0.1,<1"' in builder_runs
    assert Instruction("COPY", "--chown=toren:toren . /app") in stages[-1]


def test_project_image_can_install_toren_from_a_local_wheel() -> None:
    # TOREN_WHEEL names a wheel in wheels/; the COPY works whether wheels/ exists or not
    # (the Dockerfile itself always matches). Built for real in test_compose_scaffold.
    builder = parse(DOCKERFILES["project"])[1]
    assert Instruction("ARG", "TOREN_WHEEL=") in builder
    assert Instruction("COPY", "Dockerfile wheel[s] /tmp/wheels/") in builder
    runs = " ".join(i.args for i in builder if i.keyword == "RUN")
    assert '/opt/toren/bin/pip install "/tmp/wheels/${TOREN_WHEEL}[postgres]"' in runs


@pytest.mark.parametrize("name", DOCKERFILES)
def test_pip_only_installs_into_virtual_environments(name: str) -> None:
    # A Debian python3 base refuses `pip install` into the system (PEP 668): every install
    # goes through a venv's own pip, created with python3 (present on every Debian image).
    for stage in parse(DOCKERFILES[name])[1:]:
        for run in (i.args for i in stage if i.keyword == "RUN"):
            for n, word in enumerate(run.split()):
                if word == "install" and n and run.split()[n - 1].endswith("pip"):
                    assert run.split()[n - 1].startswith("/opt/"), run
            assert "python -m venv" not in run, "the venv must be made with python3"


def test_templates_ship_and_keep_secrets_and_history_out() -> None:
    ignore = render_project_dockerignore().splitlines()
    for entry in (".git", ".env", ".toren", "deploy"):
        assert entry in ignore
    assert ".git" in (REPO / ".dockerignore").read_text().splitlines()
    assert render_project_compose().startswith("# Toren on Docker Compose")


# -- python -m toren.adapters.docker healthcheck ------------------------------------------


def _fake_proc(tmp_path: Path, *argvs: list[str]) -> Path:
    proc = tmp_path / "proc"
    for pid, argv in enumerate(argvs, start=1):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (proc / "self").mkdir()  # non-numeric entries are skipped
    return proc


@pytest.fixture
def health_server() -> Iterator[tuple[str, list[int]]]:
    status = [200]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = status[0] if self.path == "/v1/health" else 404
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/health", status
    finally:
        server.shutdown()
        server.server_close()


SERVE = ["/opt/toren/bin/python", "/opt/toren/bin/toren", "serve", "--host", "0.0.0.0"]
WORKER = ["/opt/toren/bin/python", "/opt/toren/bin/toren", "worker"]


def test_healthcheck_probes_the_api_when_serving(
    tmp_path: Path, health_server: tuple[str, list[int]]
) -> None:
    url, status = health_server
    proc = _fake_proc(tmp_path, SERVE)
    assert healthcheck(url=url, proc=proc) == 0
    status[0] = 503
    assert healthcheck(url=url, proc=proc) == 1


def test_healthcheck_fails_when_the_api_does_not_answer(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, SERVE)
    assert healthcheck(url="http://127.0.0.1:9/v1/health", proc=proc, timeout=1) == 1


def test_a_worker_is_healthy_while_it_lives(tmp_path: Path) -> None:
    # The URL answers nothing: a worker must not be probed over HTTP.
    proc = _fake_proc(tmp_path, WORKER, ["sleep", "serve"])
    assert healthcheck(url="http://127.0.0.1:9/v1/health", proc=proc, timeout=1) == 0


def test_healthcheck_defaults_to_the_api_port() -> None:
    assert docker.HEALTH_URL == "http://127.0.0.1:8080/v1/health"
    assert docker.main(["nonsense"]) == 2
