"""Re-record the corpus: ``PYTHONPATH=src python -m tests.corpus.record [NAME ...]``.

Runs every scenario (or the named ones) on SQLite and on PostgreSQL, checks that the two
recordings are identical, and writes ``tests/fixtures/corpus/<scenario>.json``. Only
re-record for an intended, documented change to the log: the fixtures are what the
engine's behaviour is compared against (see README.md). ``--check`` writes nothing and
exits 1 if a recording differs from its fixture.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import sys
import tempfile
from pathlib import Path

from .backends import BACKENDS, FreshDatabases
from .harness import FIXTURES, dump, record
from .scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.corpus.record")
    parser.add_argument("names", nargs="*", help="scenarios to record (default: all)")
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--backend", choices=BACKENDS, action="append", help="default: both")
    parser.add_argument(
        "--repeat", type=int, default=1, help="record N times per backend (all must agree)"
    )
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {sorted(SCENARIOS)}")
    if args.list:
        for name, scenario in sorted(SCENARIOS.items()):
            print(f"{name}: {', '.join(scenario.features)}\n    {scenario.description}")
        return 0
    backends = args.backend or list(BACKENDS)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        dbs = FreshDatabases(Path(tmp))
        try:
            for name in args.names or sorted(SCENARIOS):
                failed += _one(dbs, name, backends, args.check, args.repeat)
        finally:
            dbs.close()
    print(f"{len(args.names or SCENARIOS) - failed} ok, {failed} failed")
    return 1 if failed else 0


def _one(dbs: FreshDatabases, name: str, backends: list[str], check: bool, repeat: int) -> int:
    texts: dict[str, str] = {}
    for backend in backends:
        for attempt in range(repeat):
            with dbs.fresh(backend) as url:
                text = dump(asyncio.run(record(SCENARIOS[name], url)))
            if attempt and text != texts[backend]:
                print(f"FINDING {name}: two recordings on {backend} differ (not deterministic):")
                _diff(texts[backend], text, "first", f"attempt {attempt + 1}")
                return 1
            texts[backend] = text
    first, *others = backends
    for other in others:
        if texts[other] != texts[first]:
            print(f"FINDING {name}: the {first} and {other} recordings differ:")
            _diff(texts[first], texts[other], first, other)
            return 1
    path = FIXTURES / f"{name}.json"
    if check:
        if not path.exists() or path.read_text("utf-8") != texts[first]:
            print(f"DIFFERS {name}")
            _diff(path.read_text("utf-8") if path.exists() else "", texts[first], "fixture", "now")
            return 1
        print(f"same    {name}")
        return 0
    path.write_text(texts[first], "utf-8")
    print(f"wrote   {path.relative_to(FIXTURES.parents[2])}")
    return 0


def _diff(a: str, b: str, name_a: str, name_b: str) -> None:
    lines = difflib.unified_diff(a.splitlines(), b.splitlines(), name_a, name_b, lineterm="", n=2)
    for i, line in enumerate(lines):
        if i > 80:
            print("  ...")
            break
        print("  " + line)


if __name__ == "__main__":
    sys.exit(main())
