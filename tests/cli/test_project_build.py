"""The scaffold's build backend (``build_backend.py``, from :mod:`toren.cli.project_build`):
the wheels it builds carry the project's metadata and dependencies, and nothing else but an
editable install's path. tests/cli/test_wheel.py installs a scaffold with it through pip,
with no index."""

from __future__ import annotations

import base64
import hashlib
import tarfile
import zipfile
from pathlib import Path

import pytest

from toren.cli import project_build
from toren.cli.project import project_files, scaffold

PYPROJECT = """\
[project]
name = "My.Agent"
version = "0.3.0"
description = "An agent."
requires-python = ">=3.11"
dependencies = ["toren-run>=0.1,<1", "httpx>=0.27"]

[project.optional-dependencies]
dev = ["pytest>=8", "tomli; python_version < '3.11'"]
"""


def _files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {name: z.read(name) for name in z.namelist()}


def test_every_template_installs_with_the_standard_library_alone(tmp_path: Path) -> None:
    source = Path(project_build.__file__).read_text(encoding="utf-8")
    for template in ("default", "pydantic-ai", "openai-agents"):
        files = project_files("x", template)
        assert files["build_backend.py"]() == source  # type: ignore[operator]
        pyproject = files["pyproject.toml"]
        assert isinstance(pyproject, str)
        assert "requires = []" in pyproject and 'build-backend = "build_backend"' in pyproject
        assert 'backend-path = ["."]' in pyproject
    # Only the standard library: nothing for pip to download to build it.
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert all(line.split()[1].split(".")[0] in _STDLIB for line in imports), imports


_STDLIB = {"__future__", "base64", "hashlib", "os", "pathlib", "re", "tarfile", "tomllib"}
_STDLIB |= {"typing", "zipfile"}


@pytest.mark.parametrize("editable", [False, True])
def test_the_wheel_holds_metadata_and_dependencies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, editable: bool
) -> None:
    project = tmp_path / "proj"
    scaffold(project, name="proj")
    (project / "pyproject.toml").write_text(PYPROJECT)
    monkeypatch.chdir(project)
    assert project_build.get_requires_for_build_wheel() == []
    assert project_build.get_requires_for_build_editable() == []
    build = project_build.build_editable if editable else project_build.build_wheel
    name = build(str(tmp_path))
    assert name == "my_agent-0.3.0-py3-none-any.whl"
    files = _files(tmp_path / name)
    metadata = files["my_agent-0.3.0.dist-info/METADATA"].decode()
    assert metadata.splitlines() == [
        "Metadata-Version: 2.1",
        "Name: My.Agent",
        "Version: 0.3.0",
        "Summary: An agent.",
        "Requires-Python: >=3.11",
        "Requires-Dist: toren-run>=0.1,<1",
        "Requires-Dist: httpx>=0.27",
        "Provides-Extra: dev",
        'Requires-Dist: pytest>=8; extra == "dev"',
        "Requires-Dist: tomli; (python_version < '3.11') and extra == \"dev\"",
    ]
    assert "Tag: py3-none-any" in files["my_agent-0.3.0.dist-info/WHEEL"].decode()
    pth = {n: d for n, d in files.items() if n.endswith(".pth")}
    if editable:
        assert pth == {"_my_agent_editable.pth": f"{project}\n".encode()}
    else:
        assert pth == {}
        assert not [n for n in files if n.endswith(".py")]  # no code: Toren loads the dir
    # RECORD names every other file with its hash and size.
    record = files["my_agent-0.3.0.dist-info/RECORD"].decode().splitlines()
    assert record[-1] == "my_agent-0.3.0.dist-info/RECORD,,"
    for line in record[:-1]:
        path, digest, size = line.split(",")
        data = files[path]
        want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert (digest, int(size)) == (f"sha256={want}", len(data))
    assert len(record) == len(files)


def test_the_sdist_leaves_out_local_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "proj"
    scaffold(project, name="proj")
    (project / ".toren").mkdir()
    (project / ".toren" / "toren.db").write_text("runs")
    monkeypatch.chdir(project)
    name = project_build.build_sdist(str(tmp_path))
    assert name == "proj-0.1.0.tar.gz"
    with tarfile.open(tmp_path / name) as tar:
        names = sorted(tar.getnames())
    assert "proj-0.1.0/agent.yaml" in names and "proj-0.1.0/build_backend.py" in names
    assert not [n for n in names if "/.toren" in n]


def test_a_project_without_name_or_version_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"\[project\] needs a name and a version"):
        project_build.build_wheel(str(tmp_path))
