"""Issue 34 item 3: a server's API tokens never reach its log, however they were given
(``--token``, ``TOREN_API_TOKEN``, ``TOREN_API_TOKEN=A,B`` in rotation, ``--token-file``):
a request with a token in its path and its query shows ``[redacted]`` in the access log."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from .conftest import free_port, invoke, sub_env, toren_exe
from .test_serve_hardening import _stop, _wait_healthy

TOKEN = "tok-access-log-0123456789"
OTHER = "tok-rotated-9876543210ab"


@pytest.mark.parametrize("way", ["flag", "env", "rotation", "file"])
def test_tokens_are_redacted_in_the_access_log(chain: Path, tmp_path: Path, way: str) -> None:
    port = free_port()
    args = ["--port", str(port), "--log-level", "info", "--no-console"]
    env = sub_env()
    if way == "flag":
        args += ["--token", TOKEN]
    elif way == "env":
        env["TOREN_API_TOKEN"] = TOKEN
    elif way == "rotation":
        env["TOREN_API_TOKEN"] = f"{OTHER},{TOKEN}"
    else:
        path = tmp_path / "tokens"
        path.write_text(f"{OTHER}\n{TOKEN}\n")
        args += ["--token-file", str(path)]
    proc = subprocess.Popen(
        [*toren_exe(), "--no-color", "serve", *args],
        cwd=chain.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    # Every token the server holds is sent, each in a query and a path: with two in
    # rotation, each is its own secret (the pair "A,B" as one would never match either).
    sent = [OTHER, TOKEN] if way in ("rotation", "file") else [TOKEN]
    try:
        _wait_healthy(url, proc)
        for token in sent:
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=url, timeout=10, headers=headers) as http:
                assert http.get("/v1/runs", params={"token": token}).status_code == 200
                assert http.get(f"/v1/runs/{token}").status_code in (404, 422)
    finally:
        _, logged = _stop(proc)
    assert TOKEN not in logged and OTHER not in logged, logged
    assert logged.count('"GET /v1/runs?token=[redacted] HTTP/1.1" 200') == len(sent), logged
    assert logged.count("GET /v1/runs/[redacted] HTTP/1.1") == len(sent), logged
    warned = "--token on the command line shows in the process list" in logged
    assert warned == (way == "flag"), logged


def test_a_rebindable_allowed_host_without_a_token_warns(runner: CliRunner, chain: Path) -> None:
    """Issue 34 item 4: ``--allowed-host '*'`` (or a name) on a tokenless server names the
    DNS-rebinding risk. (The port is taken: the command stops right after the check.)"""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for hosts, warned in (("*", True), (".example.com", True), ("127.0.0.1", False)):
            result = invoke(
                runner, "serve", "--port", port, "--agents", "chain", "--allowed-host", hosts
            )
            assert ("DNS rebinding" in result.stderr) == warned, (hosts, result.stderr)
            token = "tok-0123456789abcdef"
            result = invoke(
                runner,
                "serve",
                "--port",
                port,
                "--agents",
                "chain",
                "--allowed-host",
                hosts,
                env={"TOREN_API_TOKEN": token},
            )
            assert "DNS rebinding" not in result.stderr, result.stderr


def test_serve_help_recommends_the_variable_or_a_file_over_the_flag(runner: CliRunner) -> None:
    """``--token`` shows in the process list: ``serve --help`` says to prefer
    ``TOREN_API_TOKEN`` or ``--token-file``."""
    result = invoke(runner, "serve", "--help")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "Prefer TOREN_API_TOKEN or --token-file" in text, text
    assert "process list" in text, text


def test_each_part_of_a_credential_variable_is_its_own_secret() -> None:
    """Any variable named like a credential, not only TOREN_API_TOKEN: ``A,B`` is two
    secrets besides the whole value, so a log line holding one part shows neither."""
    from toren.redact import Redactor, secrets_from_env

    env = {
        "OPENAI_API_KEY": "first-key-abcdef123, second-key-987654zyx",
        "TOREN_API_TOKEN": "tok-one-0123456789,tok-two-9876543210",
        "HOME": "/root,/home",  # not a credential: nothing of it is a secret
    }
    found = secrets_from_env(env)
    for part in ("first-key-abcdef123", "second-key-987654zyx", "tok-one-0123456789"):
        assert part in found, found
    assert "/root" not in found and "/root,/home" not in found, found
    redactor = Redactor(found)
    line = "GET /v1/runs?key=second-key-987654zyx&t=tok-two-9876543210 HTTP/1.1 from /root"
    assert redactor.text(line) == "GET /v1/runs?key=[redacted]&t=[redacted] HTTP/1.1 from /root"
