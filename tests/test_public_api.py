"""The public root stays small and deliberate (as httpx does): ``toren.__all__`` is sorted,
every name in it exists, nothing public is exported by accident, and a change to the set
is a conscious edit of this list (and a CHANGELOG entry: removing a name breaks users)."""

from __future__ import annotations

import types

import toren

PUBLIC = [
    "AgentConfigError",
    "AgentNotFound",
    "AgentProgram",
    "Context",
    "InvalidInput",
    "LimitExceeded",
    "Limits",
    "LiveHub",
    "LocalWorkerRuntime",
    "ManualClock",
    "ModelCallFailed",
    "Registry",
    "RunCancelledSignal",
    "RunNotFound",
    "RunNotRetryable",
    "RunUsage",
    "Settings",
    "StepFailed",
    "SystemClock",
    "TickDeps",
    "TickResult",
    "ToolDef",
    "ToolFailed",
    "TorenError",
    "__version__",
    "connect",
    "fork_run",
    "open_store",
    "retry_run",
    "send_message",
    "start_run",
    "tick",
    "tool",
    "verify_run",
    "wait_for_run",
]


def test_the_root_exports_exactly_the_public_names() -> None:
    assert toren.__all__ == PUBLIC
    assert sorted(set(PUBLIC)) == PUBLIC  # kept sorted, no name twice


def test_every_exported_name_exists() -> None:
    for name in toren.__all__:
        assert hasattr(toren, name), name


def test_nothing_public_is_exported_by_accident() -> None:
    public = {
        name
        for name, value in vars(toren).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(toren.__all__) - {"__version__"}
