"""Fixtures of the real-Docker Compose tests (see ``dockerkit``). Without an engine, Compose
or debootstrap they skip; under ``CI=true`` that is a failure, since ``.ci/run`` installs
and starts all three."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.deploy import dockerkit


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true requires Docker for the Compose tests: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def compose_cmd() -> list[str]:
    try:
        dockerkit.require_engine()
        return dockerkit.compose_command()
    except dockerkit.DockerUnavailable as exc:
        _unavailable(str(exc))
        raise


@contextmanager
def _building_images() -> Iterator[None]:
    """One process at a time builds the stand-in images (pytest-xdist runs the Compose
    tests side by side): the others wait, then find them built."""
    with open(dockerkit.cache_dir() / "images.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def base_image(compose_cmd: list[str]) -> str:
    """The stand-in for python:3.11-slim-bookworm: Debian's python3 (pip refuses, PEP 668)."""
    try:
        with _building_images():
            return dockerkit.ensure_base_image()
    except dockerkit.DockerUnavailable as exc:
        _unavailable(str(exc))
        raise


@pytest.fixture(scope="session")
def postgres_image(base_image: str) -> str:
    """The stand-in for postgres:15."""
    with _building_images():
        return dockerkit.ensure_postgres_image(base_image)
