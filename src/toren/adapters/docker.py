"""Container files for an agent project, and the image's health check.

``toren init`` writes :func:`render_project_dockerfile`, :func:`render_project_compose`
and :func:`render_project_dockerignore` into a new agent project. The templates are
package data under ``toren/adapters/templates``; the repository's own ``compose.yaml``
is the same file as the project one, and a test keeps the two identical.

The image runs either ``toren worker`` or ``toren serve``, and Docker's ``HEALTHCHECK``
applies to both, so ``python -m toren.adapters.docker healthcheck`` decides by the
process it finds: a container running ``toren serve`` must answer ``/v1/health``; a
worker has no HTTP port, and is healthy while its process lives.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path

HEALTH_URL = "http://127.0.0.1:8080/v1/health"

__all__ = [
    "HEALTH_URL",
    "healthcheck",
    "render_project_compose",
    "render_project_dockerfile",
    "render_project_dockerignore",
]


def _template(name: str) -> str:
    return (resources.files("toren.adapters") / "templates" / name).read_text(encoding="utf-8")


def render_project_dockerfile() -> str:
    """The Dockerfile of an agent project: toren-run 0.x (from PyPI, or from a wheel in
    ``wheels/`` named by the build argument ``TOREN_WHEEL``) plus the project files."""
    return _template("Dockerfile.project")


def render_project_compose() -> str:
    """The compose.yaml of an agent project: PostgreSQL 15, two workers, the API."""
    return _template("compose.yaml")


def render_project_dockerignore() -> str:
    """The .dockerignore that keeps history, local state and secrets out of the image."""
    return _template("dockerignore.project")


def _process_argvs(proc: Path) -> Iterable[list[str]]:
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:  # the process ended while we looked
            continue
        yield [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def _runs_toren_serve(argv: Sequence[str]) -> bool:
    for i, arg in enumerate(argv):
        if Path(arg).name == "toren":
            return "serve" in argv[i + 1 :]
    return False


def healthcheck(*, url: str = HEALTH_URL, proc: Path = Path("/proc"), timeout: float = 4.0) -> int:
    """Exit status for Docker's HEALTHCHECK: 0 healthy, 1 unhealthy."""
    if not any(_runs_toren_serve(argv) for argv in _process_argvs(proc)):
        return 0
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"toren healthcheck: {url} failed: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str]) -> int:
    if list(argv) != ["healthcheck"]:
        print("usage: python -m toren.adapters.docker healthcheck", file=sys.stderr)
        return 2
    return healthcheck(url=os.environ.get("TOREN_HEALTHCHECK_URL", HEALTH_URL))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
