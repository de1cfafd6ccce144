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
    parser.add_argument("--backend", choices=BACKENDS, action="append", help="default: both")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {sorted(SCENARIOS)}")
    backends = args.backend or list(BACKENDS)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        dbs = FreshDatabases(Path(tmp))
        try:
            for name in args.names or sorted(SCENARIOS):
                failed += _one(dbs, name, backends, args.check)
        finally:
            dbs.close()
    print(f"{len(args.names or SCENARIOS) - failed} ok, {failed} failed")
    return 1 if failed else 0


def _one(dbs: FreshDatabases, name: str, backends: list[str], check: bool) -> int:
    texts = {}
    for backend in backends:
        with dbs.fresh(backend) as url:
            texts[backend] = dump(asyncio.run(record(SCENARIOS[name], url)))
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
