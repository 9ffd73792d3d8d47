"""Load a corpus and cut documents into heading-aware chunks (seed stage 01).

Contract:
- ``load_documents(corpus_dir)``: with a ``docs/`` or ``stories/`` folder (the seed layout), one
  Document per ``docs/*.md`` then ``stories/*.txt``, each sorted by name, ``doc_id`` the file
  stem; otherwise one per ``*.md`` at any depth (hidden folders skipped), sorted by path,
  ``doc_id`` the relative path without ``.md`` (``guides/setup``). ``title``: the first H1 of a
  Markdown file, else its first non-blank line. Files must be UTF-8 (a BOM is dropped); CRLF is
  kept as is. A missing, non-directory, unreadable or empty corpus, a file that is not a regular
  file (directory, FIFO, socket, link loop, dangling link), a NUL byte or a doc_id found twice
  raises ``CorpusError`` naming the path, as does a file name that is not UTF-8.
- ``chunk(doc, max_chars=1200, overlap=1)``: headings (``#`` to ``######`` then a space, outside
  a fence) open sections; blank lines separate blocks; a fenced code block is one block; blocks
  are packed greedily up to ``max_chars`` and never split; the next chunk carries ``overlap``
  blocks when they leave room for a new one. ``doc.text[c.start_char:c.end_char] == c.text``.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from retrieval_assets.types import Chunk, Document

_HEADING = re.compile(r"(#{1,6}) (.*)")
_FENCE = re.compile(r"(`{3,}|~{3,})")


class CorpusError(ValueError):
    """A corpus file or directory that cannot be loaded; the message names it."""


@dataclass(frozen=True)
class _Block:
    start: int
    end: int


def _read_text(path: Path) -> str:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise CorpusError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if (nul := text.find("\0")) >= 0:
        raise CorpusError(f"{path}: a NUL byte at character {nul} (Postgres text cannot hold it); is this a binary file?")
    return text.removeprefix("\ufeff")


def _lines(text: str):
    """Yield (start, end, line) with ``end`` before the line break (``\\n`` or ``\\r\\n``)."""
    pos = 0
    for raw in text.splitlines(keepends=True):
        line = raw.rstrip("\r\n")
        yield pos, pos + len(line), line
        pos += len(raw)


def _markdown_title(text: str) -> str | None:
    fence = None
    for _, _, line in _lines(text):
        fence, is_code = _fence_state(fence, line)
        if is_code:
            continue
        m = _HEADING.match(line)
        if m and len(m.group(1)) == 1:
            return m.group(2).strip()
    return None


def corpus_files(corpus_dir: str | Path) -> list[tuple[str, Path]]:
    """``(doc_id, path)`` of every document of a corpus directory, in load order (see the contract)."""
    root = Path(corpus_dir)
    if not root.exists():
        raise CorpusError(f"corpus directory not found: {root}")
    if not root.is_dir():
        raise CorpusError(f"{root}: the corpus must be a directory, not a file")
    try:
        if (root / "docs").is_dir() or (root / "stories").is_dir():
            paths = sorted((root / "docs").glob("*.md")) + sorted((root / "stories").glob("*.txt"))
            found = [(p.stem, p) for p in paths]
        else:
            paths = sorted(p for p in root.rglob("*.md") if not any(part.startswith(".") for part in p.relative_to(root).parts))
            found = [(p.relative_to(root).with_suffix("").as_posix(), p) for p in paths]
    except OSError as exc:
        raise CorpusError(f"{root}: cannot read the corpus directory ({exc.strerror or exc})") from None
    if not found:
        raise CorpusError(f"{root}: no Markdown files (*.md at any depth, or docs/*.md and stories/*.txt)")
    seen: dict[str, Path] = {}
    for doc_id, path in found:
        _check_name(doc_id, path)
        _check_regular(path)
        if doc_id in seen:
            raise CorpusError(f"duplicate doc_id '{doc_id}': {seen[doc_id]} and {path} (rename one)")
        seen[doc_id] = path
    return found


def _check_name(doc_id: str, path: Path) -> None:
    """Refuse a file whose name (its doc_id) is not UTF-8: Python holds its bytes as lone surrogates, which
    no Postgres statement can send; named with those bytes escaped, so the message prints."""
    try:
        doc_id.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise CorpusError(f"{shown}: the file name is not UTF-8 (rename it)") from None


def _check_regular(path: Path) -> None:
    """Refuse, by name, anything but a readable regular file (or a link to one)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorpusError(f"{path}: a symbolic link loop") from None
        if path.is_symlink():
            raise CorpusError(f"{path}: a dangling symbolic link (its target {os.readlink(path)} does not exist)") from None
        raise CorpusError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise CorpusError(f"{path}: {kind}, not a regular file")


def load_documents(corpus_dir: str | Path) -> list[Document]:
    """Read every document of a corpus directory (see the contract for the layouts)."""
    documents = []
    for doc_id, path in corpus_files(corpus_dir):
        text = _read_text(path)
        first_line = next((line.strip() for _, _, line in _lines(text) if line.strip()), "")
        title = _markdown_title(text) if path.suffix == ".md" else None
        documents.append(Document(doc_id=doc_id, title=title or first_line or doc_id, text=text))
    return documents


def _fence_state(fence: str | None, line: str) -> tuple[str | None, bool]:
    """Advance the fence state by one line; return (new state, line belongs to a fence)."""
    if fence is None:
        m = _FENCE.match(line)
        return (m.group(1), True) if m else (None, False)
    stripped = line.rstrip()
    closes = stripped.startswith(fence) and set(stripped) == {fence[0]}
    return (None if closes else fence), True


def _sections(text: str) -> list[tuple[str, list[_Block]]]:
    """Split a document into (heading_path, blocks) sections."""
    sections: list[tuple[str, list[_Block]]] = [("", [])]
    open_headings: list[tuple[int, str]] = []
    fence: str | None = None
    block_start: int | None = None
    block_end = 0

    def close_block() -> None:
        nonlocal block_start
        if block_start is not None:
            sections[-1][1].append(_Block(block_start, block_end))
            block_start = None

    for start, end, line in _lines(text):
        if fence is not None:  # inside a fenced block: everything belongs to it
            fence, _ = _fence_state(fence, line)
            block_end = end
            if fence is None:
                close_block()
            continue
        heading = _HEADING.match(line)
        if heading:
            close_block()
            level = len(heading.group(1))
            while open_headings and open_headings[-1][0] >= level:
                open_headings.pop()
            open_headings.append((level, heading.group(2).strip()))
            path = " > ".join(title for _, title in open_headings)
            sections.append((path, [_Block(start, end)]))
            continue
        opened, _ = _fence_state(None, line)
        if opened is not None:
            close_block()
            fence, block_start, block_end = opened, start, end
            continue
        if not line.strip():
            close_block()
            continue
        if block_start is None:
            block_start = start
        block_end = end
    close_block()
    return [(path, blocks) for path, blocks in sections if blocks]


def _pack(blocks: list[_Block], max_chars: int, overlap: int) -> list[tuple[int, int]]:
    """Greedy packing of blocks into (first, last_exclusive) index ranges."""
    ranges: list[tuple[int, int]] = []
    first, n = 0, len(blocks)
    while first < n:
        last = first + 1
        while last < n and blocks[last].end - blocks[first].start <= max_chars:
            last += 1
        ranges.append((first, last))
        if last >= n:
            break
        carried = max(last - overlap, 0)
        fits = overlap > 0 and carried > first and blocks[last].end - blocks[carried].start <= max_chars
        first = carried if fits else last
    return ranges


def chunk(doc: Document, *, max_chars: int = 1200, overlap: int = 1) -> list[Chunk]:
    """Cut ``doc`` into chunks by the stage-01 rules; ids are ``f"{doc_id}#{index:03d}"``."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    if overlap < 0:
        raise ValueError(f"overlap must be zero or more, got {overlap}")
    chunks: list[Chunk] = []
    for path, blocks in _sections(doc.text):
        for first, last in _pack(blocks, max_chars, overlap):
            start, end = blocks[first].start, blocks[last - 1].end
            chunks.append(
                Chunk(
                    chunk_id=f"{doc.doc_id}#{len(chunks):03d}",
                    doc_id=doc.doc_id,
                    heading_path=path,
                    start_char=start,
                    end_char=end,
                    text=doc.text[start:end],
                )
            )
    return chunks


def stats(documents: list[Document], *, max_chars: int = 1200, overlap: int = 1) -> dict[str, object]:
    """Corpus statistics: documents, characters, chunks, oversized chunks, chunks per document."""
    per_doc = {d.doc_id: chunk(d, max_chars=max_chars, overlap=overlap) for d in documents}
    counts = sorted(len(c) for c in per_doc.values())
    all_chunks = [c for cs in per_doc.values() for c in cs]
    return {
        "documents": len(documents),
        "characters": sum(len(d.text) for d in documents),
        "chunks": len(all_chunks),
        "oversized_chunks": sum(len(c.text) > max_chars for c in all_chunks),
        "chunks_per_document": {
            "min": counts[0] if counts else 0,
            "median": counts[len(counts) // 2] if counts else 0,
            "max": counts[-1] if counts else 0,
        },
        "max_chars": max_chars,
        "overlap": overlap,
    }
