"""The step path's instruction count (issue 19's "no regression" check).

One tick of a run of ``--steps`` sequential model calls (zero-latency fake model, ~2 KB
answers), SQLite ``synchronous=OFF`` so the count is the engine's and SQLite's CPU, not the
disk's. Run it under callgrind twice and take the difference (a 2,500- and a 500-step
run), which cancels interpreter start-up, imports and the schema:

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p python -m bench.steppath --steps 500
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p python -m bench.steppath --steps 2500

instructions per step = (Ir(2500) - Ir(500)) / 2000, Ir from the ``summary:`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import toren
from bench import toren_bench as tb


async def main(steps: int, path: Path) -> None:
    store = await toren.connect(f"sqlite:///{path}?synchronous=off")
    reg = tb.registry()
    deps = toren.TickDeps(store=store, agents=reg, providers={"bench": tb.FakeModel()})
    run = await toren.start_run(store, reg, "sequential", {"steps": steps})
    result = await toren.tick(run.id, deps)
    assert result.status == "completed" and result.executed == steps, result
    await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(args.steps, Path(tmp) / "steppath.db"))
