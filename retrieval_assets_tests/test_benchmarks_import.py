"""Every benchmark script imports and has a callable ``main``, and ``python -m benchmarks`` lists and runs
them by name, so a script broken by a change of the library fails here and not the next time someone runs it.

The modules are found by walking benchmarks/ (a new script is covered without editing this
file); importing one must do no work (the scripts run under ``if __name__ == "__main__":``).
"""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELPERS = {"benchmarks.common", "benchmarks.__main__"}  # the shared helpers and the entry point, not scripts
KEPT = {"bench_search", "bench_text", "bench_embed", "bench_index", "bench_bm25", "scale", "cranfield", "quality", "support_floor",
        "fuzz", "executors", "load", "drafted"}


def _modules() -> list[tuple[str, bool]]:
    """(dotted name, is a package) of every module under benchmarks/, the package itself included."""
    found = [("benchmarks", True)]
    found += [(m.name, m.ispkg) for m in pkgutil.walk_packages([str(ROOT / "benchmarks")], prefix="benchmarks.")]
    return sorted(found)


MODULES = _modules()
SCRIPTS = {name.rsplit(".", 1)[1] for name, is_package in MODULES if not is_package and name not in HELPERS}


def _benchmarks(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_walk_finds_the_scripts():
    names = {name for name, _ in MODULES}
    # the scripts behind the published figures: a walk that silently finds nothing would pass every test below
    assert {"benchmarks.common", "benchmarks.guards.bench_search", "benchmarks.calibration.support_floor"} <= names
    assert KEPT <= SCRIPTS
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


def test_python_m_benchmarks_lists_every_script():
    done = _benchmarks()
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")}
    assert listed == SCRIPTS
    for line in done.stdout.splitlines():  # each with its one-line description
        if line.startswith("  "):
            assert len(line.split(maxsplit=1)) == 2, line


def test_python_m_benchmarks_runs_a_script_by_name():
    done = _benchmarks("support_floor", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m benchmarks support_floor")


def test_an_unknown_benchmark_is_one_line_and_exit_2():
    done = _benchmarks("no_such_benchmark", "--repeats", "1")
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "unknown benchmark 'no_such_benchmark'" in lines[0] and "bench_search" in lines[0]


@pytest.mark.parametrize(("sources", "message"), [
    ("nope=1", "unknown retrieval parameter(s): nope"),
    ("weights=[0.4,0.6,0.1]", "weights must be two numbers within [0, 1]"),  # a list's commas stay inside its value
    ("doc_weight", "doc_weight"),
])
def test_answer_supports_bad_sources_are_one_usage_line_and_exit_2(sources, message):
    done = _benchmarks("answer_support", "--sources", sources)
    assert done.returncode == 2 and done.stdout == ""
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"python -m benchmarks answer_support: error: --sources {sources}: ") and message in last


def test_package_corpora_converts_each_markup_to_the_markdown_the_chunker_reads():
    """The answer benchmark's corpora (benchmarks/calibration/package_corpora.py): reStructuredText, AsciiDoc and MyST
    become headings, fences and prose; MyST roles their text, its directives kept for the answerer to read."""
    from benchmarks.calibration import package_corpora as pc

    assert pc.rst_to_md("Title\n=====\n\nRun it like this::\n\n    $ restic init\n") == \
        "# Title\n\nRun it like this:\n\n```\n$ restic init\n```\n\n"
    assert pc.asciidoc_to_md("== Fixing mistakes\n\n----\n$ git restore :/\n----\nSee linkgit:git-reset[1].\n") == \
        "## Fixing mistakes\n\n```\n$ git restore :/\n```\nSee git-reset(1).\n"
    myst = pc.myst_to_md("See {ref}`the cache <pip cache>` and {ref}`Installing`, {issue}`9475`, {any}`x`.\n```{note}\nA note.\n```\n")
    assert myst == "See the cache and Installing, 9475, `x`.\n```{note}\nA note.\n```\n"
    assert set(pc.UNSEEN).isdisjoint(pc.SOURCES)  # a corpus nothing is fitted on is never a training corpus


@pytest.mark.skipif(shutil.which("man") is None, reason="man(1) renders the manual pages (Debian's man-db)")
def test_package_corpora_renders_a_manual_page_as_markdown():
    """APT's German manual pages (the unseen apt-de corpus): the NAME line the title, sections and subsections headings,
    an item's tag a paragraph before its description, no header, footer or indentation."""
    from benchmarks.calibration import package_corpora as pc

    page = (".TH APT-MARK 8 \"2023\" \"APT\" \"APT\"\n.SH NAME\napt-mark \\- zeigt Einstellungen\n.SH BESCHREIBUNG\n"
            "apt-mark kann benutzt werden, um Pakete zu markieren.\n.SS Optionen\n.PP\n\\fBhold\\fR\n.RS 4\nhold wird benutzt, um ein Paket "
            "als zurückgehalten zu markieren.\n.RE\n")  # DocBook's items: .PP, the tag, .RS 4, the description, .RE
    assert pc.man_to_md(page) == ("# apt-mark - zeigt Einstellungen\n\n## BESCHREIBUNG\n\napt-mark kann benutzt werden, um Pakete zu "
                                  "markieren.\n\n### Optionen\n\nhold\n\nhold wird benutzt, um ein Paket als zurückgehalten zu markieren.\n")
