"""``python -m benchmarks`` lists the benchmarks; ``python -m benchmarks NAME [options]`` runs one.

NAME is a script's module name without its folder (``bench_search`` runs ``benchmarks/guards/bench_search.py``);
``python -m benchmarks NAME --help`` gives its options. An unknown NAME is one line on stderr and exit status 2.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parent


def scripts() -> dict[str, Path]:
    """Every script by NAME: the modules in the folders under benchmarks/."""
    return {p.stem: p for p in sorted(FOLDER.glob("*/*.py"), key=lambda p: p.stem) if p.stem != "__init__"}


def summary(path: Path) -> str:
    """The first paragraph of a script's docstring on one line, read without importing the script."""
    return " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split("\n\n", 1)[0].split())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    found = scripts()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m benchmarks NAME [options]   (python -m benchmarks NAME --help: its options)\n")
        width = max(map(len, found))
        for name, path in found.items():
            print(f"  {name:<{width}}  {summary(path)}")
        return 0
    name, *rest = argv
    if name not in found:
        print(f"python -m benchmarks: unknown benchmark {name!r} (known: {', '.join(found)})", file=sys.stderr)
        return 2
    module = importlib.import_module(".".join(found[name].relative_to(FOLDER.parent).with_suffix("").parts))
    sys.argv[0] = f"python -m benchmarks {name}"  # what argparse shows as the program
    return module.main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
