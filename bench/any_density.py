"""``typing.Any`` per 1,000 lines of ``src/``, measured as the code design reviews measure
it: every use of the name ``Any`` (``Any`` or ``typing.Any`` in an annotation, an alias or
a cast; the import itself is not a use) per 1,000 physical lines of every ``.py`` file.

    python bench/any_density.py            # the figure (CI prints it)
    python bench/any_density.py --top 20   # and the files with the most uses
    python bench/any_density.py --max 15   # exit 1 above 15 per 1,000 lines
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src"


def any_uses(source: str, name: str = "<src>") -> int:
    """The uses of ``Any`` in one module's source."""
    return sum(
        1
        for node in ast.walk(ast.parse(source, name))
        if (isinstance(node, ast.Name) and node.id == "Any")
        or (isinstance(node, ast.Attribute) and node.attr == "Any")
    )


def measure(root: Path) -> tuple[int, int, dict[str, int]]:
    """(uses, lines, uses per file) over every ``.py`` file under ``root``."""
    uses = lines = 0
    per_file: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        lines += len(source.splitlines())
        n = any_uses(source, str(path))
        uses += n
        if n:
            per_file[str(path.relative_to(root))] = n
    return uses, lines, per_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, default=ROOT)
    parser.add_argument("--top", type=int, default=0, help="list the N files with most uses")
    parser.add_argument("--max", type=float, default=None, help="fail above this density")
    args = parser.parse_args(argv)
    uses, lines, per_file = measure(args.root)
    density = uses * 1000 / lines if lines else 0.0
    print(f"Any: {uses} uses in {lines} lines of {args.root.name}/: {density:.1f} per 1,000")
    for path, n in sorted(per_file.items(), key=lambda kv: (-kv[1], kv[0]))[: args.top]:
        print(f"  {n:4d}  {path}")
    if args.max is not None and density > args.max:
        print(f"above the bound of {args.max} per 1,000 lines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
