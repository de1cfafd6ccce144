"""Real Docker for the Compose tests: the engine, stand-in base images, Compose itself.

Docker Hub is out of reach where these tests run, so the images that ``compose.yaml`` and
the Dockerfiles name (``python:3.11-slim-bookworm``, ``postgres:15``) are stood in for by
images built here:

- the **base**: a Debian bookworm root file system made by ``debootstrap`` (minbase plus
  Debian's ``python3`` and ``python3-venv``) and turned into an image by ``docker import``.
  Its system Python refuses ``pip install`` (PEP 668), which is exactly the case the
  Dockerfiles must handle. The root file system is kept as a tarball in the cache
  directory, so a machine that has made it once only re-imports it;
- **PostgreSQL 15**: ``tests/deploy/compose/postgres`` on that base, Debian's
  ``postgresql-15`` behind an entry point that honours ``POSTGRES_USER``,
  ``POSTGRES_PASSWORD``, ``POSTGRES_DB``, ``PGDATA`` and ``PGPORT`` like the official image.

Every container of these tests runs with ``network_mode: host`` and the engine runs with
``--bridge=none --iptables=false`` (``.ci/run`` starts it so): all traffic stays on
127.0.0.1. Builds run with ``--network host`` so that they reach PyPI and Debian's mirror.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ASSETS = Path(__file__).resolve().parent / "compose"

# Bump the suffix when the recipe below changes, so cached images are not reused.
RECIPE = "r1"
ROOTFS_IMAGE = f"toren-test/bookworm-rootfs:{RECIPE}"
BASE_IMAGE = f"toren-test/python:3.11-bookworm-{RECIPE}"
POSTGRES_IMAGE = f"toren-test/postgres:15-{RECIPE}"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


class DockerUnavailable(Exception):
    """Docker, Compose or debootstrap cannot be used here (the message says which)."""


def cache_dir() -> Path:
    root = os.environ.get("TOREN_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "toren-tests"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sh(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
    check: bool = True,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise with its output, so a test says what went wrong."""
    result = subprocess.run(
        list(argv),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        input=input,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"`{' '.join(argv)}` exited {result.returncode}\n"
            f"--- stdout\n{result.stdout[-6000:]}\n--- stderr\n{result.stderr[-6000:]}"
        )
    return result


def require_engine() -> None:
    if shutil.which("docker") is None:
        raise DockerUnavailable("the docker CLI is not installed (CI: apt-get install docker.io)")
    probe = sh(["docker", "info", "--format", "{{.ServerVersion}}"], check=False, timeout=30)
    if probe.returncode != 0:
        raise DockerUnavailable(
            "no Docker engine answers (.ci/run starts one: "
            f"dockerd --bridge=none --iptables=false): {probe.stderr.strip()}"
        )


def compose_command() -> list[str]:
    """Compose v2 (`docker compose`) when the plugin is there, else docker-compose v1."""
    if sh(["docker", "compose", "version"], check=False, timeout=30).returncode == 0:
        return ["docker", "compose"]
    exe = shutil.which("docker-compose")
    if exe is None:
        raise DockerUnavailable("no Compose: neither `docker compose` nor docker-compose")
    return [exe]


def image_exists(name: str) -> bool:
    return sh(["docker", "image", "inspect", name], check=False, timeout=60).returncode == 0


def debian_mirror(sources: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt is configured with (deb822 or one-line sources)."""
    files = sorted(sources.glob("sources.list.d/*.sources")) + [sources / "sources.list"]
    files += sorted(sources.glob("sources.list.d/*.list"))
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and SUITE in suites.group(1).split():
                return uris.group(1).rstrip("/")
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                return parts[1].rstrip("/")
    return DEFAULT_MIRROR


def ensure_base_image() -> str:
    """The stand-in Debian Python image; built once, its root file system cached on disk."""
    if image_exists(BASE_IMAGE):
        return BASE_IMAGE
    tarball = cache_dir() / f"bookworm-python-rootfs-{RECIPE}.tar"
    if not tarball.is_file():
        if shutil.which("debootstrap") is None:
            raise DockerUnavailable(
                "debootstrap is not installed (CI: apt-get install debootstrap)"
            )
        if os.geteuid() != 0:
            raise DockerUnavailable("debootstrap needs root to build the base image")
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            rootfs = Path(tmp) / "rootfs"
            sh(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}",
                    SUITE,
                    str(rootfs),
                    debian_mirror(),
                ],
                timeout=900,
            )
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for entry in (rootfs / junk).glob("*"):
                    if entry.is_file():
                        entry.unlink()
            partial = tarball.with_suffix(".partial")
            sh(["tar", "-C", str(rootfs), "-cf", str(partial), "."], timeout=600)
            partial.rename(tarball)
    with tempfile.TemporaryDirectory() as tmp:
        trust = Path(tmp)
        _host_trust(trust)
        sh(["docker", "import", *IMPORT_CHANGES, str(tarball), ROOTFS_IMAGE], timeout=600)
        build(trust, BASE_IMAGE, args={"ROOTFS_IMAGE": ROOTFS_IMAGE})
    return BASE_IMAGE


IMPORT_CHANGES = (
    "--change",
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "--change",
    "ENV LANG=C.UTF-8",
    "--change",
    'CMD ["python3"]',
)

TRUST_DOCKERFILE = """\
ARG ROOTFS_IMAGE
FROM ${ROOTFS_IMAGE}
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY pip.conf /etc/pip.conf
"""


def _host_trust(into: Path) -> None:
    """The host's CA bundle and a pip.conf that uses it. Where HTTPS goes through an
    intercepting proxy, the host trusts its CA; the stand-in base must too, or a build
    could not reach PyPI (pip in a venv uses its own bundle unless told otherwise)."""
    bundle = Path(os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt")
    (into / "ca-certificates.crt").write_bytes(bundle.read_bytes())
    (into / "pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    (into / "Dockerfile").write_text(TRUST_DOCKERFILE)


def ensure_postgres_image(base: str) -> str:
    if not image_exists(POSTGRES_IMAGE):
        build(ASSETS / "postgres", POSTGRES_IMAGE, args={"BASE_IMAGE": base})
    return POSTGRES_IMAGE


def build(
    context: Path,
    tag: str,
    *,
    args: Mapping[str, str] | None = None,
    dockerfile: Path | None = None,
) -> None:
    argv = ["docker", "build", "--network", "host", "-t", tag]
    for key, value in (args or {}).items():
        argv += ["--build-arg", f"{key}={value}"]
    if dockerfile is not None:
        argv += ["-f", str(dockerfile)]
    # The classic builder: no BuildKit frontend image to pull from Docker Hub.
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    sh([*argv, str(context)], env=env, timeout=900)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(what: str, probe: object, timeout: float, interval: float = 0.5) -> object:
    """Poll ``probe()`` until it returns something truthy; fail naming ``what``."""
    assert callable(probe)
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except Exception as exc:  # reported if the deadline passes
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


def build_wheel(out: Path) -> Path:
    """A wheel of this checkout (what the scaffold's image installs instead of PyPI)."""
    out.mkdir(parents=True, exist_ok=True)
    sh(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        timeout=600,
    )
    (wheel,) = out.glob("toren_run-*.whl")
    return wheel
