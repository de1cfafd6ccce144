"""``toren dev``'s worker switch: the API reads the worker that runs now, and between two
workers (or before the first agent exists) it answers from the runtime, never an error."""

from __future__ import annotations

from pathlib import Path

import httpx

from toren.api import create_app
from toren.cli.servers import WorkerSwitch
from toren.core.drivers.worker import LocalWorkerRuntime
from toren.runtime import close_runtime, open_runtime


async def test_the_api_reads_whichever_worker_runs_now(db_url: str, tmp_path: Path) -> None:
    runtime = await open_runtime(tmp_path, db_url)
    try:
        switch = WorkerSwitch(runtime)
        app = create_app(runtime.store, runtime.resolver, runtime=switch)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            # No worker yet: the plan and the metrics answer, with nothing in flight.
            assert (await http.get("/v1/plan")).status_code == 200
            metrics = await http.get("/metrics")
            assert metrics.status_code == 200
            assert "toren_worker_active_runs 0" in metrics.text
            assert switch.deps is runtime.deps
            assert switch.cancel_local("run_none") is False

            worker = LocalWorkerRuntime(runtime.reload_deps())
            switch.current = worker
            worker.metrics.backoffs = 3
            assert switch.metrics is worker.metrics and switch.deps is worker.deps
            assert "toren_worker_backoffs_total 3" in (await http.get("/metrics")).text
    finally:
        await close_runtime(runtime)
