"""What `toren dev`'s watcher reloads for and names (issue 40 item 10): editors and
operating systems leave files beside the agent's code while it is edited (vim's swap file
and its write probe `4913`, backups, JetBrains' safe-write copies, `.DS_Store`). Those are
not the agent's code: they neither change its code version nor appear in a reload line.

The watcher runs as in `toren dev` (the real `watchfiles` watch on a `toren init`
scaffold); the test writes the litter and then one real edit, and reads the reload lines."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from toren.agents.loader import directory_hash
from toren.cli.project import scaffold
from toren.cli.servers import WorkerSwitch, _agent_versions, _start_worker, _watch
from toren.runtime import close_runtime, open_runtime, sqlite_url_for

LITTER = [
    "4913",  # vim: may I write here?
    "5036",  # ... and the next probe while 4913 exists
    ".tools.py.swp",
    "tools.py~",
    "#tools.py#",
    ".#tools.py",
    "tools.py___jb_tmp___",
    "tools.py___jb_old___",
    "prompts/system.md.tmp",
    ".DS_Store",
    "prompts/.DS_Store",
    "Thumbs.db",
    "~$notes.docx",
    "__pycache__/tools.cpython-311.pyc",
    "tools.cpython-311.pyc",
]


def test_litter_is_not_part_of_the_code_version(tmp_path: Path) -> None:
    root = tmp_path / "hello"
    scaffold(root, name="hello")
    before = directory_hash(root)
    for rel in LITTER:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"litter {rel}\n")
        assert directory_hash(root) == before, rel
    # A file named with digits is code unless it is one of vim's probes.
    (root / "4914").write_text("data\n")
    assert directory_hash(root) != before


async def test_dev_reload_lines_name_only_the_agents_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "hello"
    scaffold(root, name="hello")
    runtime = await open_runtime(root, sqlite_url_for(root), None)
    switch = WorkerSwitch(runtime)
    stop = asyncio.Event()
    versions = _agent_versions(runtime)
    assert versions is not None
    first = dict(versions)
    switch.current = await _start_worker(runtime)
    watch = asyncio.create_task(_watch(root, runtime, switch, versions, stop))
    seen = ""
    try:
        # The watch has no "ready" signal: write the litter and an edit until it reports a
        # reload (the first attempt nearly always; each later one writes both again).
        for attempt in range(100):
            for rel in LITTER:
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_text(f"litter {attempt}\n")
            (root / "4913").unlink()  # as vim does
            (root / "tools.py").write_text(
                (root / "tools.py").read_text() + f"\n# edit {attempt}\n"
            )
            for _ in range(20):
                await asyncio.sleep(0.05)
                seen += capsys.readouterr().out
                if "reloaded" in seen:
                    break
            if "reloaded" in seen:
                break
        # Litter alone after the reload: nothing to reload for.
        for rel in LITTER:
            (root / rel).write_text("more litter\n")
        (root / "tools.py").write_text((root / "tools.py").read_text() + "\n# last\n")
        for _ in range(200):
            await asyncio.sleep(0.05)
            seen += capsys.readouterr().out
            if seen.count("reloaded") >= 2:
                break
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(watch, 10)
        if switch.current is not None:
            await switch.current.stop(drain_window=0)
        await close_runtime(runtime)
    lines = [line for line in seen.splitlines() if line.startswith("reloaded")]
    assert len(lines) >= 2, seen
    for line in lines:
        assert line.startswith("reloaded (tools.py): hello "), line
    assert versions["hello"][1] != first["hello"][1]  # the edit is a new version
