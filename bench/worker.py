"""One scenario in one fresh process (so RSS, DB size and module-level singletons such as
DBOS's belong to that scenario alone).

    python -m bench.worker run --module bench.peers.dbos_bench --scenario sequential \
        --backend sqlite --kwargs '{"steps": 500}' --out /tmp/r.json
    python -m bench.worker recovery-child ...   (used by scenarios.recovery_driver)
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

from bench.common import Backend, peak_rss_mb, ru_maxrss_mb  # noqa: E402
from bench.scenarios import scenario_callable  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["run", "recovery-child"])
    ap.add_argument("--module", required=True)
    ap.add_argument("--scenario")
    ap.add_argument("--backend")
    ap.add_argument("--backend-json")
    ap.add_argument("--tag", default="x")
    ap.add_argument("--kwargs", default="{}")
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--counter")
    ap.add_argument("--hang-at", type=int, default=0)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()

    if a.mode == "recovery-child":
        backend = Backend.from_json(a.backend_json)
        t_imp = time.perf_counter()
        mod = importlib.import_module(a.module)
        t_run = time.perf_counter()
        mod.recovery_child(backend, a.steps, a.counter, a.hang_at)
        t_end = time.perf_counter()
        with open(a.counter + f".timing{a.hang_at}.json", "w") as f:
            json.dump(
                {
                    "import_s": round(t_run - t_imp, 3),
                    "run_s": round(t_end - t_run, 3),
                    "since_worker_start_s": round(t_end - T_START, 3),
                },
                f,
            )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the run is complete and durable: skip interpreter/library shutdown

    mod = importlib.import_module(a.module)
    backend = Backend.fresh(a.backend, a.tag)
    result: dict[str, object]
    try:
        fn = scenario_callable(mod, a.scenario)
        result = dict(fn(backend, **json.loads(a.kwargs)))
        if a.scenario == "concurrency" or "peak_rss_mb" not in result:
            result["peak_rss_mb"] = peak_rss_mb()
            result["ru_maxrss_mb"] = ru_maxrss_mb()  # inflated by the spawning parent, see common
        if a.scenario == "recovery":
            timing = os.path.join(backend.workdir, "recovery_counter.txt.timing0.json")
            if os.path.exists(timing):
                with open(timing) as f:
                    result["resume_child_inprocess"] = json.load(f)
        result["ok"] = True
    except Exception as e:  # report, don't crash the harness
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    finally:
        if not a.keep:
            backend.drop()
    with open(a.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
