"""How ``pip install -e .`` (or ``pip install .``) installs this agent project, with
nothing to download: a build backend in the Python standard library alone, named by
``[build-system]`` in pyproject.toml (``backend-path = ["."]``).

Written by ``toren init`` (Toren's ``toren.cli.project_build``). A build backend from a
package index (setuptools, hatchling) would have to be downloaded on every install, so
the project would not install where no index is reachable, such as beside a Toren
installed from a checkout. This one needs none: the install takes its dependencies
(``toren-run``) from the environment when they are there, else from the index.

What it installs: the project's metadata and dependencies from ``[project]``
(``dependencies``, ``optional-dependencies``, ``requires-python``). An editable install
also puts this directory on ``sys.path`` (so ``import tools`` works in your tests). Toren
itself loads the agent from its directory, so a non-editable install copies no code.
See "Installing Toren" in Toren's docs/deploy.md.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
]

_TAG = "py3-none-any"
_LEFT_OUT = {".toren", ".git", ".venv", "venv", "__pycache__", "dist", "build"}


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    return []


def get_requires_for_build_editable(config_settings: Any = None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings: Any = None) -> list[str]:
    return []


def build_wheel(
    wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None
) -> str:
    return _wheel(Path(wheel_directory), editable=False)


def build_editable(
    wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None
) -> str:
    return _wheel(Path(wheel_directory), editable=True)


def build_sdist(sdist_directory: str, config_settings: Any = None) -> str:
    name, version, _ = _project()
    base = f"{name}-{version}"
    target = Path(sdist_directory) / f"{base}.tar.gz"
    here = Path.cwd()
    with tarfile.open(target, "w:gz") as tar:
        for dirpath, dirnames, filenames in os.walk(here):
            dirnames[:] = sorted(d for d in dirnames if d not in _LEFT_OUT)
            for filename in sorted(filenames):
                path = Path(dirpath, filename)
                tar.add(path, arcname=f"{base}/{path.relative_to(here).as_posix()}")
    return target.name


def _project() -> tuple[str, str, str]:
    """(normalised name, version, METADATA text) from pyproject.toml's ``[project]``."""
    with open("pyproject.toml", "rb") as f:
        project = tomllib.load(f).get("project") or {}
    if not project.get("name") or not project.get("version"):
        raise ValueError("pyproject.toml: [project] needs a name and a version")
    name, version = str(project["name"]), str(project["version"])
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if project.get("description"):
        lines.append(f"Summary: {project['description']}")
    if project.get("requires-python"):
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
    for extra, deps in (project.get("optional-dependencies") or {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for dep in deps:
            requirement, _, marker = str(dep).partition(";")
            when = f'({marker.strip()}) and extra == "{extra}"' if marker else f'extra == "{extra}"'
            lines.append(f"Requires-Dist: {requirement.strip()}; {when}")
    return re.sub(r"[-_.]+", "_", name).lower(), version, "\n".join(lines) + "\n"


def _wheel(directory: Path, *, editable: bool) -> str:
    name, version, metadata = _project()
    info = f"{name}-{version}.dist-info"
    files = {
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: toren-project-build\n"
            f"Root-Is-Purelib: true\nTag: {_TAG}\n"
        ),
    }
    if editable:
        files[f"_{name}_editable.pth"] = f"{Path.cwd()}\n"
    record = [f"{info}/RECORD,,"]
    target = directory / f"{name}-{version}-{_TAG}.whl"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as wheel:
        for arcname, text in files.items():
            data = text.encode("utf-8")
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.insert(-1, f"{arcname},sha256={digest.decode()},{len(data)}")
            wheel.writestr(arcname, data)
        wheel.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return target.name
