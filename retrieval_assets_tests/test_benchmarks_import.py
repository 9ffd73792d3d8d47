"""Every benchmark script imports and has a callable ``main``, so a script broken by a change of
the library fails here and not the next time someone runs it.

The modules are found by walking benchmarks/ (a new script is covered without editing this
file); importing one must do no work (the scripts run under ``if __name__ == "__main__":``).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELPERS = {"benchmarks.common"}  # shared helpers, not scripts


def _modules() -> list[tuple[str, bool]]:
    """(dotted name, is a package) of every module under benchmarks/, the package itself included."""
    found = [("benchmarks", True)]
    found += [(m.name, m.ispkg) for m in pkgutil.walk_packages([str(ROOT / "benchmarks")], prefix="benchmarks.")]
    return sorted(found)


MODULES = _modules()


def test_walk_finds_the_scripts():
    names = {name for name, _ in MODULES}
    # one script of each folder: a walk that silently finds nothing would pass every test below
    assert {"benchmarks.common", "benchmarks.guards.bench_search", "benchmarks.profiles.profile_index",
            "benchmarks.calibration.support_floor"} <= names
    # every .py file under benchmarks/ is a module of the walk (no folder without __init__.py)
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for p in (ROOT / "benchmarks").rglob("*.py")}
    assert files == names


@pytest.mark.parametrize(("name", "is_package"), MODULES, ids=[name for name, _ in MODULES])
def test_benchmark_module_imports(name, is_package):
    module = importlib.import_module(name)
    if is_package or name in HELPERS:
        return
    assert callable(getattr(module, "main", None)), f"{name} has no callable main()"
