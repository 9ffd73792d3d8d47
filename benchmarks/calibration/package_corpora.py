"""Build the answer benchmark's corpora from Debian packages into a cache folder (nothing copied into the repo).

Run: uv run python -m benchmarks package_corpora [--cache DIR]   # prints each corpus's folder and chunk count

``restic`` is the backup tool's user manual (the reStructuredText sources that Debian's ``restic`` package ships
under /usr/share/doc/restic/html/_sources), ``git`` is the Git user manual (``git-doc``'s user-manual.txt, AsciiDoc);
``pip`` (``UNSEEN``: never fitted on) is pip's user guide, MyST Markdown already (``python3-pip``); ``apt-de`` (unseen too)
APT's German manual pages, rendered by man(1).
Each is fetched with ``apt-get download`` (no root needed), unpacked with ``dpkg-deb -x`` and converted to Markdown:
headings become ``#`` headings, literal and listing blocks become fences, inline markup its rendered text; prose is
kept as it is. The questions (``answer_questions/<name>.yaml``, written here: question, doc_id, anchor) become the
folder's golden.yaml, its on-topic questions the manual does not answer (``<name>-unanswerable.yaml``) its unanswerable.yaml. A folder built from the same package version is reused. Default cache:
``.retrieval/answer_corpora`` in the project (ignored by git).
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks import common

QUESTIONS = Path(__file__).resolve().parent / "answer_questions"
CACHE = common.ROOT / ".retrieval" / "answer_corpora"
# name: (Debian package, folder of its documents, file glob, converter name, subfolders left out)
SOURCES = {
    "restic": ("restic", "usr/share/doc/restic/html/_sources", "*.rst.txt", "rst", ()),
    "git": ("git-doc", "usr/share/doc/git-doc", "user-manual.txt", "asciidoc", ()),
}
# Corpora nothing is fitted or chosen on, not even held out: answer_support measures the shipped answerer on them.
# ``pip`` is pip's user guide, the MyST Markdown pages of Debian's ``python3-pip`` (its developer pages left out).
# ``apt-de`` is APT's German manual pages (Debian's ``apt``: apt, apt-get, apt-cache, apt.conf, sources.list ...), a
# corpus in another language than any question or default was written for.
UNSEEN = {
    "pip": ("python3-pip", "usr/share/doc/python3-pip/html", "**/*.md*", "myst", ("development",)),
    "apt-de": ("apt", "usr/share/man/de", "**/*.gz", "man", ()),
}


def _heading(level: int, text: str) -> str:
    return f"{'#' * min(level, 6)} {text.strip()}"


def rst_to_md(text: str) -> str:
    """reStructuredText to Markdown: over/underlined titles by order of appearance, code blocks fenced,
    directives' bodies kept as paragraphs, comments and labels dropped, roles and links as their text."""
    lines, out, styles, i = text.splitlines(), [], [], 0
    rule = re.compile(r"^([#*=^\"~+`'-])\1{2,}\s*$")
    while i < len(lines):
        line = lines[i]
        over = rule.match(line) and i + 2 < len(lines) and rule.match(lines[i + 2]) and lines[i + 1].strip()
        under = line.strip() and not rule.match(line) and i + 1 < len(lines) and rule.match(lines[i + 1]) \
            and len(lines[i + 1].strip()) >= len(line.strip())
        if over or under:
            style = (lines[i + (2 if over else 1)][0], bool(over))
            styles += [style] if style not in styles else []
            out.append(_heading(styles.index(style) + 1, lines[i + 1] if over else line))
            i += 3 if over else 2
            continue
        code = re.match(r"^\.\. (code-block|code)::", line) or (line.rstrip().endswith("::") and not line.startswith(".."))
        if line.startswith("..") and not code:  # a directive, comment or label: its body, if prose, stays
            keep = re.match(r"^\.\. (note|warning|important|tip)::\s*(.*)", line)
            out.append(keep.group(2) if keep else "")
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                out.append(lines[i].strip() if keep else "")
                i += 1
            continue
        if code:
            if not line.startswith(".."):
                out.append(re.sub(r"\s*::$", ":" if line.strip() != "::" else "", line.rstrip()))
            block, i = [], i + 1
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            body = [b for b in block if not re.match(r"^\s+:\w+:", b)]
            width = min((len(b) - len(b.lstrip()) for b in body if b.strip()), default=0)
            out += ["", "```", *(b[width:] for b in body if b.strip() or b is not body[0]), "```", ""]
            continue
        out.append(line)
        i += 1
    md = "\n".join(out)
    md = re.sub(r":\w+:`([^`<]*?)\s*<[^`>]*>`", r"\1", md)  # :ref:`text <label>`
    md = re.sub(r":\w+:`([^`]*)`", r"\1", md)
    md = re.sub(r"`([^`<]+?)\s*<[^`>]+>`__?", r"\1", md)  # `text <url>`_
    return re.sub(r"(?<!`)``([^`\n]+)``(?!`)", r"`\1`", md) + "\n"


def asciidoc_to_md(text: str) -> str:
    """AsciiDoc to Markdown: ``=`` titles as ``#``, listing and literal blocks fenced, anchors and attribute
    lines dropped, ``linkgit:x[n]`` as ``x(n)`` and cross references as their text."""
    out, fence = [], None
    for line in text.splitlines():
        delimiter = re.fullmatch(r"(-{4,}|\.{4,})\s*", line)
        if fence is not None:
            out.append("```" if line.strip() == fence else line)
            fence = None if line.strip() == fence else fence
            continue
        if delimiter:
            fence = line.strip()
            out.append("```")
        elif m := re.match(r"^(=+) (.*)", line):
            out.append(_heading(len(m.group(1)), m.group(2)))
        elif re.fullmatch(r"\[\[[^\]]*\]\]|\[[a-zA-Z][^\]]*\]|={4,}|\+", line.strip()):
            out.append("")
        else:
            line = re.sub(r"linkgit:([\w.-]+)\[(\d)\]", r"\1(\2)", line)
            line = re.sub(r"<<[^,>]+,\s*([^>]+)>>", r"\1", line)
            out.append(re.sub(r"<<([^>]+)>>", lambda m: m.group(1).replace("-", " "), line))
    return "\n".join(out) + "\n"


def myst_to_md(text: str) -> str:
    """MyST Markdown as the chunker reads it: roles as their text (``{ref}`text <target>``` -> text, ``{ref}`target``` ->
    target, ``{issue}`9475``` -> 9475); directives stay (the answerer reads notes and tabs as prose, code as code)."""
    text = re.sub(r"\{[\w:-]+\}`([^`<]*?)\s*<[^`>]*>`", r"\1", text)
    text = re.sub(r"\{(?:ref|doc|term|issue|pull|user|envvar|option)\}`([^`]*)`", r"\1", text)
    return re.sub(r"\{[\w:-]+\}`([^`]*)`", r"`\1`", text)


def man_to_md(source: str) -> str:
    """A manual page (its groff source) as Markdown: rendered by man(1) unjustified, unhyphenated and without a line width,
    the header and footer lines dropped; the NAME line the title, sections ``##`` and subsections ``###`` headings, an
    item's tag (an option, a keyword) a paragraph of its own before its description; indentation removed."""
    rendered = subprocess.run(["man", "--nj", "--nh", "-l", "-"], input=source, text=True, capture_output=True, check=True,
                              env={**os.environ, "MANWIDTH": "2000", "MAN_KEEP_FORMATTING": ""}).stdout
    lines = rendered.replace("\t", "        ").splitlines()[1:-1]
    out: list[str] = []
    for line in lines:
        depth = len(line) - len(line.lstrip())
        if not line.strip():
            continue
        if depth == 0:
            out += ["", _heading(2, line)]
        elif depth < 7:
            out += ["", _heading(3, line)]
        elif out == ["", "## NAME"]:
            out[:] = [_heading(1, line)]
        else:
            out += ["", line.strip()]
    return "\n".join(out).strip() + "\n"


def _download(package: str, into: Path) -> str:
    """``apt-get download`` + ``dpkg-deb -x`` of ``package`` into ``into``; returns its version."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", package], cwd=tmp, check=True, capture_output=True)
        [deb] = Path(tmp).glob("*.deb")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(into)], check=True)
        return subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True, text=True).stdout.strip()


def build(name: str, cache: Path = CACHE) -> Path:
    """The corpus folder of ``name`` (docs/*.md and golden.yaml), built once per package version."""
    target = cache / name
    if not (target / "VERSION").exists():
        _convert(name, target)
    for questions, kept in ((f"{name}.yaml", "golden.yaml"), (f"{name}-unanswerable.yaml", "unanswerable.yaml")):
        if (QUESTIONS / questions).exists():
            shutil.copyfile(QUESTIONS / questions, target / kept)
    return target


def _convert(name: str, target: Path) -> None:
    package, folder, pattern, kind, left_out = (SOURCES | UNSEEN)[name]
    shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        version = _download(package, Path(tmp))
        (target / "docs").mkdir(parents=True)
        convert = {"rst": rst_to_md, "asciidoc": asciidoc_to_md, "myst": myst_to_md, "man": man_to_md}[kind]
        root = Path(tmp) / folder
        for path in sorted(root.glob(pattern)):
            if path.relative_to(root).parts[0] in left_out:
                continue
            text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text(encoding="utf-8")
            stem = "-".join([*path.relative_to(root).parts[:-1], path.name.split(".")[0]]).replace("_", "-").lower()
            (target / "docs" / f"{stem}.md").write_text(convert(text))
    (target / "VERSION").write_text(f"{package} {version}\n")


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__, dsn=False)
    parser.add_argument("--cache", type=Path, default=CACHE)
    args = parser.parse_args(argv)
    from retrieval_assets.index import chunker

    for name in [*SOURCES, *UNSEEN]:
        path = build(name, args.cache)
        chunks = [c for d in chunker.load_documents(path) for c in chunker.chunk(d)]
        print(f"{name}: {path} ({(path / 'VERSION').read_text().strip()}), {len(chunks)} chunks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
