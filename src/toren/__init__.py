"""Toren: a durable runtime for LLM agents.

Agent runs survive crashes, restarts and deploys: they resume under the code now deployed,
replay finished steps from their event log without paying for them again, and re-run only
what the new code genuinely changes.
"""

from toren.config import Settings
from toren.core.agent_api.context import Context, RunUsage
from toren.core.agent_api.program import AgentProgram, Limits, Registry, ToolDef, tool
from toren.core.contract.clock import ManualClock, SystemClock
from toren.core.drivers.fixforward import fork_run, retry_run
from toren.core.drivers.live import LiveHub
from toren.core.drivers.runs import send_message, start_run, wait_for_run
from toren.core.drivers.tick import TickDeps, TickResult, tick
from toren.core.drivers.verify import verify_run
from toren.core.drivers.worker import LocalWorkerRuntime
from toren.errors import (
    AgentConfigError,
    AgentNotFound,
    InvalidInput,
    LimitExceeded,
    ModelCallFailed,
    RunCancelledSignal,
    RunNotFound,
    RunNotRetryable,
    StepFailed,
    ToolFailed,
    TorenError,
)
from toren.store import connect, open_store

__version__ = "0.1.0"

__all__ = [
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
