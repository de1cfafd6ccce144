"""The scenarios, and the contract a system plugs in with.

A system is a module (``bench/peers/dbos_bench.py``, ``bench/peers/langgraph_bench.py``,
``bench/toren_bench.py``) that defines the callables in :class:`SystemModule`. The harness
(``bench/run.py``) runs each scenario in a fresh worker process (``bench/worker.py``) with
a fresh :class:`~bench.common.Backend` (empty SQLite file or empty PostgreSQL database),
so peak RSS and database size belong to that scenario alone.

Every scenario returns a flat ``dict`` of JSON-serialisable figures. The keys the table
reads are listed in :data:`HEADLINE`; extra keys are kept in results.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from bench.common import Backend

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class SystemModule(Protocol):
    """What ``bench/toren_bench.py`` (or any peer) must define. All functions are plain
    synchronous callables (run an event loop inside if the system is async)."""

    NAME: str  # "toren", "dbos", "langgraph"

    def info(self) -> dict[str, Any]:
        """Versions and the durability setting actually used, e.g. {"version": "0.1.0"}."""
        ...

    def sequential(self, backend: Backend, steps: int) -> dict[str, Any]:
        """(a) One run of ``steps`` model-call steps; each step calls
        ``common.fake_model(i)`` (zero latency, 2 KB) and its result is durably recorded
        before the next step starts. Return at least ``steps_per_s`` and ``bytes_per_step``
        (``backend.size_bytes()`` after setup vs. after the run, divided by steps)."""
        ...

    def conversation(self, backend: Backend, steps: int) -> dict[str, Any]:
        """(b) One run of ``steps`` steps where step i's model input is the whole history
        (all previous responses) and its 2 KB response is appended to it. Call
        ``clock.tick()`` (``common.StepClock``) at the start of every step execution and
        merge ``clock.rates()`` (first10/last10 steps/s) into the result, plus
        ``steps_per_s`` and ``bytes_per_step``."""
        ...

    def concurrency(
        self, backend: Backend, runs: int, steps: int, model_url: str
    ) -> dict[str, Any]:
        """(c) ``runs`` runs in flight at once in this one worker process, each of ``steps``
        steps, each step ``await common.ModelClient(model_url).complete(prompt)`` (200 ms
        loopback server; share one client). Return ``steps_per_s`` (total steps / wall
        time from first start to last completion). The worker adds ``peak_rss_mb``."""
        ...

    def recovery_child(self, backend: Backend, steps: int, counter_path: str, hang_at: int) -> None:
        """(d) Run, or resume, the run with the fixed id ``"bench-recovery"`` of ``steps``
        steps to completion. Every step execution calls
        ``common.CrashCounter(counter_path, hang_at).hit(i)`` first (one counter per
        process). Called twice in two processes: first with ``hang_at=kill_at`` (the
        process is SIGKILLed while step ``kill_at`` hangs), then with ``hang_at=0`` in a
        new process, which must resume the same run from the same backend and return
        when the run is complete."""
        ...


SCENARIO_NAMES = ("sequential", "conversation", "concurrency", "recovery")

# Sizes: full and --quick.
PARAMS: dict[str, dict[str, dict[str, int]]] = {
    "full": {
        "sequential": {"steps": 500},
        "conversation": {"steps": 500},
        "concurrency": {"runs": 1000, "steps": 10},
        "recovery": {"steps": 500, "kill_at": 250},
    },
    "quick": {
        "sequential": {"steps": 200},
        "conversation": {"steps": 200},
        "concurrency": {"runs": 200, "steps": 10},
        "recovery": {"steps": 200, "kill_at": 100},
    },
}

# (scenario, result key, label, higher_is_better) rows shown in the table.
HEADLINE: list[tuple[str, str, str, bool]] = [
    ("sequential", "steps_per_s", "sequential: steps/s", True),
    ("sequential", "bytes_per_step", "sequential: bytes/step", False),
    ("conversation", "first10_steps_per_s", "conversation: steps/s, first 10", True),
    ("conversation", "last10_steps_per_s", "conversation: steps/s, last 10", True),
    ("conversation", "steps_per_s", "conversation: steps/s, all", True),
    ("conversation", "bytes_per_step", "conversation: bytes/step", False),
    ("concurrency", "steps_per_s", "concurrency: steps/s", True),
    ("concurrency", "peak_rss_mb", "concurrency: worker peak RSS MB", False),
    ("recovery", "reexecuted", "recovery: steps re-executed", False),
    ("recovery", "resume_s", "recovery: process start→done s", False),
]


def scenario_callable(mod: Any, name: str) -> Callable[..., dict[str, Any]]:
    """The callable for ``name``; recovery defaults to :func:`recovery_driver` around the
    module's ``recovery_child`` unless the module defines its own ``recovery``."""
    if name == "recovery" and not hasattr(mod, "recovery"):
        return lambda backend, steps, kill_at: recovery_driver(
            mod.__name__, backend, steps, kill_at
        )
    return getattr(mod, name)


def _child_cmd(module: str, backend: Backend, steps: int, counter: str, hang_at: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.worker",
        "recovery-child",
        "--module",
        module,
        "--backend-json",
        backend.to_json(),
        "--steps",
        str(steps),
        "--counter",
        counter,
        "--hang-at",
        str(hang_at),
    ]


def _lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def recovery_driver(module: str, backend: Backend, steps: int, kill_at: int) -> dict[str, Any]:
    """(d) Start a child running the run; when the counter file shows step ``kill_at``
    executing (the child hangs there), SIGKILL it; start a new child that resumes; count
    re-executed steps from the counter file and time the new process from spawn to exit."""
    counter = os.path.join(backend.workdir, "recovery_counter.txt")
    if os.path.exists(counter):
        os.unlink(counter)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t_first = time.perf_counter()
    p = subprocess.Popen(_child_cmd(module, backend, steps, counter, kill_at), cwd=REPO, env=env)
    deadline = time.time() + 600
    while _lines(counter) < kill_at:
        if p.poll() is not None:
            raise RuntimeError(f"recovery child exited early with {p.returncode}")
        if time.time() > deadline:
            p.kill()
            raise RuntimeError("recovery child too slow")
        time.sleep(0.002)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    first_phase_s = time.perf_counter() - t_first
    before = _lines(counter)

    t0 = time.perf_counter()
    q = subprocess.run(
        _child_cmd(module, backend, steps, counter, 0), cwd=REPO, env=env, timeout=600
    )
    resume_s = time.perf_counter() - t0
    if q.returncode != 0:
        raise RuntimeError(f"resume child failed with {q.returncode}")
    total = _lines(counter)
    with open(counter) as f:
        executed = [int(x) for x in f.read().split()]
    return {
        "steps": steps,
        "kill_at": kill_at,
        "executed_before_kill": before,
        "executed_after_resume": total - before,
        "reexecuted": total - steps,
        "distinct_steps_executed": len(set(executed)),
        "complete": len(set(executed)) == steps,
        "resume_s": round(resume_s, 3),
        "first_phase_s": round(first_phase_s, 3),
    }


def dumps(d: dict[str, Any]) -> str:
    return json.dumps(d, sort_keys=True)
