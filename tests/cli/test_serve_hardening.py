"""Issue 23, the servers the CLI starts: the Host allow-list, --log-level reaching the HTTP
server (its access log), IPv6 URLs, short tokens and the insecure-bind hint."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from toren.cli.main import cli as cli_main

from .conftest import free_port, invoke, sub_env, toren_exe


def _serve(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*toren_exe(), "--no-color", "serve", *args],
        cwd=cwd,
        env=sub_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_healthy(url: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("the server did not start")


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.terminate()
    return proc.communicate(timeout=30)


def test_serve_on_ipv6_loopback_prints_a_bracketed_url_logs_access_and_refuses_other_hosts(
    chain: Path,
) -> None:
    port = free_port()
    proc = _serve("--host", "::1", "--port", str(port), "--log-level", "info", cwd=chain.parent)
    url = f"http://[::1]:{port}"
    try:
        _wait_healthy(url, proc)
        with httpx.Client(base_url=url, timeout=10) as http:
            rebound = http.post(
                "/v1/runs",
                json={"agent": "chain", "input": {}},
                headers={"Host": "attacker.example"},
            )
            cross = http.post(
                "/v1/runs",
                json={"agent": "chain", "input": {}},
                headers={"Origin": "http://attacker.example"},
            )
            listed = http.get("/v1/runs")
    finally:
        out, err = _stop(proc)
    assert f"API {url}/v1" in out and f"console {url}/" in out, out
    assert rebound.status_code == 400 and rebound.json()["error"]["code"] == "host_not_allowed"
    assert "attacker.example" in rebound.json()["error"]["message"]
    assert "--allowed-host" in rebound.json()["error"]["message"]
    assert cross.status_code == 403 and cross.json()["error"]["code"] == "cross_site_request"
    assert listed.status_code == 200 and listed.json()["runs"] == []  # nothing was started
    # --log-level info reaches uvicorn: one access line per request.
    assert '"GET /v1/health HTTP/1.1" 200' in err, err
    assert '"POST /v1/runs HTTP/1.1" 400' in err, err


def test_allowed_host_option_admits_a_name(chain: Path) -> None:
    port = free_port()
    proc = _serve(
        "--port", str(port), "--allowed-host", "toren.internal,127.0.0.1", cwd=chain.parent
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        named = httpx.get(f"{url}/v1/agents", headers={"Host": f"toren.internal:{port}"})
        other = httpx.get(f"{url}/v1/agents", headers={"Host": "localhost"})
    finally:
        _stop(proc)
    assert named.status_code == 200, named.text
    assert other.status_code == 400  # not in the list given


def test_insecure_bind_hint_says_what_to_do(runner: CliRunner, chain: Path) -> None:
    result = invoke(runner, "serve", "--host", "0.0.0.0")
    assert result.exit_code == 5
    assert "--debug" not in result.stderr
    assert "hint:" in result.stderr and "TOREN_API_TOKEN" in result.stderr.split("hint:")[1]


def test_short_tokens_are_refused_at_start_without_echoing_them(
    runner: CliRunner, chain: Path
) -> None:
    result = invoke(runner, "serve", "--token", "abc123xyz")
    assert result.exit_code == 5
    assert "at least 16" in result.stderr and "abc123xyz" not in result.output
    assert "--debug" not in result.stderr


def test_a_bad_allowed_host_is_a_clear_error(runner: CliRunner, chain: Path) -> None:
    result = invoke(runner, "dev", str(chain), "--allowed-host", "http://x.example/")
    assert result.exit_code == 5
    assert "'http://x.example/' is not a host name" in result.stderr


def test_a_token_with_a_newline_is_named_not_echoed_nor_a_connection_problem(
    runner: CliRunner, chain: Path
) -> None:
    token = "cli-token-0123456789\n"
    result = invoke(runner, "runs", "list", "--url", "http://127.0.0.1:9", "--token", token)
    assert result.exit_code == 5
    assert "line break" in result.stderr and "0123456789" not in result.output
    assert "is the server running" not in result.stderr and "cannot connect" not in result.stderr
    assert "hint: fix --token" in result.stderr


def _served_options(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, *args: str, **kw: Any
) -> dict[str, Any]:
    """The options ``toren serve`` hands to uvicorn (its serve call recorded, not run)."""
    import toren.api.server

    seen: dict[str, Any] = {}

    async def record(app: Any, host: str, port: int, **options: Any) -> None:
        seen.update(toren.api.server._config(app, host, port, **options).__dict__)

    monkeypatch.setattr(toren.api.server, "serve", record)
    result = invoke(runner, "serve", "--port", str(free_port()), *args, **kw)
    assert result.exit_code == 0, result.output
    return seen


def test_the_server_outlasts_its_clients_idle_connections(
    runner: CliRunner, chain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: under 200 concurrent event reads an idle keep-alive connection was closed
    by the server (uvicorn's 5 s) just as a client (httpx keeps idle connections 5 s) sent
    its next request on it: a dropped connection. The server now keeps an idle connection
    longer than common clients do, and behind a load balancer longer than it does."""
    client_idle = httpx.AsyncClient()._transport._pool._keepalive_expiry  # type: ignore[attr-defined]
    assert client_idle is not None
    default = _served_options(runner, monkeypatch)["timeout_keep_alive"]
    assert default == 75 and default > client_idle > 0
    behind_alb = _served_options(runner, monkeypatch, env={"TOREN_KEEP_ALIVE": "3605"})[
        "timeout_keep_alive"
    ]
    assert behind_alb == 3605
    flag = _served_options(runner, monkeypatch, "--keep-alive", "90")
    assert flag["timeout_keep_alive"] == 90
    bad = runner.invoke(cli_main, ["serve", "--keep-alive", "0"])
    assert bad.exit_code == 2 and "--keep-alive" in bad.output


def test_the_aws_module_keeps_the_api_connections_longer_than_its_alb() -> None:
    from toren.adapters.aws import terraform_module_dir

    ecs = (terraform_module_dir() / "ecs.tf").read_text()
    assert '{ name = "TOREN_KEEP_ALIVE", value = tostring(var.alb_idle_timeout + 5) }' in ecs
