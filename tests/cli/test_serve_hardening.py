"""Issue 23, the servers the CLI starts: the Host allow-list, --log-level reaching the HTTP
server (its access log), IPv6 URLs, short tokens and the insecure-bind hint."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
from click.testing import CliRunner

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
