"""Deprecation grace: renamed agent.yaml keys, CLI flags and HTTP fields keep working for
one more minor, with a warning naming the new spelling; all listed by
``toren version --deprecations``."""

from __future__ import annotations

from click.testing import CliRunner

from toren.cli.main import cli
from toren.deprecations import registry


def test_the_registry_covers_every_surface() -> None:
    entries = registry()
    assert {e.surface for e in entries} == {"agent.yaml", "cli", "http"}
    assert all(e.removed_in and e.new and e.old != e.new for e in entries)


def test_version_lists_every_deprecation() -> None:
    result = CliRunner().invoke(cli, ["version", "--deprecations"])
    assert result.exit_code == 0
    for entry in registry():
        assert f"{entry.old!r} -> {entry.new!r}" in result.output
        assert f"removed in {entry.removed_in}" in result.output


def test_deprecated_worker_flag_still_works_and_warns(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from toren.cli import servers

    seen: dict[str, object] = {}

    async def fake_worker(root, settings, worker_id=None, early_stop=None):  # type: ignore[no-untyped-def]
        seen["drain_window"] = settings.drain_window

    monkeypatch.setattr(servers, "_worker", fake_worker)
    result = CliRunner().invoke(
        cli, ["worker", "--agents", str(tmp_path), "--drain-timeout", "12"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert seen["drain_window"] == 12.0  # the old flag still sets the drain window
    assert "'toren worker --drain-timeout' is deprecated" in result.output
    assert "'toren worker --drain-window'" in result.output and "0.3.0" in result.output
