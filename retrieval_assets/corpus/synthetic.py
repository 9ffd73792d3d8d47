"""A deterministic synthetic Markdown corpus for scale measurements.

Documents look like technical notes: an H1 title, ``##``/``###`` sections, paragraphs of
sentences, bullet lists and fenced code blocks. Words come from a generated vocabulary
(pronounceable pseudo-words, shorter ones more frequent) drawn with a Zipf-Mandelbrot law,
``p(rank r) ~ 1 / (r + 2.7) ** s``; the most frequent ranks are real English function words,
so Postgres' English configuration drops them as it would in real text.

Topics (``topics > 0``, the default 300): real collections are about things, so documents that
share a subject share words beyond the frequent ones. Each topic owns ``topic_words`` content
words (drawn uniformly from the vocabulary below its 100 most frequent content words) with a
Zipf law of its own; a document has one topic, and each of its content words comes from that
topic with probability ``topic_share``, else from the corpus-wide law. Queries pick a topic
and draw each word from it with probability 0.7. With ``topics=0`` every word is independent
of every other (the earlier generator, kept as a worst case: all neighbourhoods are equally far).

Determinism: document ``i`` is a pure function of ``(seed, i)`` (its own ``random.Random``),
so every corpus is a prefix of every larger one and any document can be regenerated alone.
Python's ``random`` is used, whose seeded streams are stable across versions.

    uv run python -m retrieval_assets.corpus.synthetic --docs 2            # print two documents
    uv run python -m retrieval_assets.corpus.synthetic --chunks 10000 --stats
"""

from __future__ import annotations

import argparse
import itertools
import random
from bisect import bisect
from collections.abc import Iterator

from retrieval_assets.index import chunker
from retrieval_assets.types import Chunk, Document

# The most frequent ranks: function words that Postgres' english stop list removes.
FUNCTION_WORDS = (
    "the of and to a in is that for it as with was on be by this are or from at an which not have has but "
    "can will we its these their been more when into than such each"
).split()

_ONSETS = "b c d f g h k l m n p r s t v z br cr dr fl gr kl pl pr st tr ch sh th".split()
_VOWELS = "a e i o u ai ea io ou".split()
_CODAS = ["", "", "", "n", "r", "s", "l", "t", "m", "x", "nd", "rk"]


def vocabulary(size: int = 20_000, seed: int = 0) -> list[str]:
    """``size`` distinct words by rank (0 = most frequent): function words, then pseudo-words
    whose length grows with rank (1-2 syllables first, up to 4)."""
    rng = random.Random(f"vocabulary:{seed}")
    words = list(FUNCTION_WORDS)
    seen = set(words)
    while len(words) < size:
        rank = len(words)
        syllables = 1 + (rank > 300) + (rank > 3_000) + (rank > 12_000) + (rng.random() < 0.3)
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + rng.choice(_CODAS)
        if word not in seen and len(word) > 2:
            seen.add(word)
            words.append(word)
    return words


class Corpus:
    """The synthetic corpus of one ``seed``; see the module docstring."""

    def __init__(self, seed: int = 0, *, vocab_size: int = 20_000, zipf_s: float = 1.0, zipf_q: float = 2.7,
                 topics: int = 300, topic_words: int = 400, topic_share: float = 0.4):
        self.seed = seed
        self.words = vocabulary(vocab_size, seed)
        weights = [1.0 / (r + zipf_q) ** zipf_s for r in range(1, vocab_size + 1)]
        self.cum_weights = list(itertools.accumulate(weights))
        self.first_content = len(FUNCTION_WORDS)
        content = weights[self.first_content :]
        self.content_cum = list(itertools.accumulate(content))
        self.content_share = self.content_cum[-1] / self.cum_weights[-1]  # P(a word is a content word)
        self.topic_share = topic_share
        rng = random.Random(f"topics:{seed}")
        pool = range(self.first_content + 100, vocab_size)
        self.topics = [rng.sample(pool, topic_words) for _ in range(topics)]
        self.topic_cum = list(itertools.accumulate(1.0 / (r + zipf_q) ** zipf_s for r in range(1, topic_words + 1)))

    # -- sampling ----------------------------------------------------------------------------

    def _topic_word(self, rng: random.Random, topic: int) -> str:
        ranks, cw = self.topics[topic], self.topic_cum
        return self.words[ranks[bisect(cw, rng.random() * cw[-1])]]

    def _words(self, rng: random.Random, k: int, topic: int | None = None) -> list[str]:
        """``k`` running-text words: corpus-wide Zipf; in a topic, content words come from the
        topic with probability ``topic_share`` (function words keep their corpus-wide rate)."""
        cw, words, total, rand = self.cum_weights, self.words, self.cum_weights[-1], rng.random
        if topic is None:
            return [words[bisect(cw, rand() * total)] for _ in range(k)]
        from_topic = self.content_share * self.topic_share
        return [self._topic_word(rng, topic) if rand() < from_topic else words[bisect(cw, rand() * total)] for _ in range(k)]

    def _content_words(self, rng: random.Random, k: int, topic: int | None = None, share: float | None = None) -> list[str]:
        cw, words, off, total, rand = self.content_cum, self.words, self.first_content, self.content_cum[-1], rng.random
        share = self.topic_share if share is None else share
        return [
            self._topic_word(rng, topic) if topic is not None and rand() < share else words[off + bisect(cw, rand() * total)]
            for _ in range(k)
        ]

    def _sentence(self, rng: random.Random, topic: int | None) -> str:
        words = self._words(rng, rng.randint(6, 22), topic)
        if rng.random() < 0.15:  # an inline code span
            words[rng.randrange(len(words))] = f"`{'_'.join(self._content_words(rng, 2, topic))}()`"
        text = " ".join(words)
        return text[0].upper() + text[1:] + rng.choice(".....?:")

    def _paragraph(self, rng: random.Random, topic: int | None) -> str:
        return " ".join(self._sentence(rng, topic) for _ in range(rng.randint(2, 6)))

    def _code(self, rng: random.Random, topic: int | None) -> str:
        name = lambda: "_".join(self._content_words(rng, rng.randint(1, 2), topic))  # noqa: E731
        lines = [f"def {name()}({name()}, {name()}=None):"]
        for _ in range(rng.randint(2, 8)):
            lines.append(f"    {name()} = {name()}({name()}, {rng.randint(0, 99)})")
        lines.append(f"    return {name()}")
        lang = rng.choice(["python", "python", "sql", ""])
        if lang == "sql":
            lines = [f"SELECT {name()}, {name()} FROM {name()} WHERE {name()} = {rng.randint(0, 9)};" for _ in range(rng.randint(1, 4))]
        return "\n".join([f"```{lang}", *lines, "```"])

    def _list(self, rng: random.Random, topic: int | None) -> str:
        return "\n".join(f"- {' '.join(self._words(rng, rng.randint(3, 10), topic))}" for _ in range(rng.randint(2, 6)))

    def _heading(self, rng: random.Random, level: int, topic: int | None) -> str:
        return "#" * level + " " + " ".join(w.capitalize() for w in self._content_words(rng, rng.randint(1, 4), topic))

    # -- documents ---------------------------------------------------------------------------

    def document(self, i: int) -> Document:
        rng = random.Random(f"document:{self.seed}:{i}")
        topic = rng.randrange(len(self.topics)) if self.topics else None
        title = " ".join(w.capitalize() for w in self._content_words(rng, rng.randint(2, 6), topic))
        blocks = [f"# {title}", self._paragraph(rng, topic)]
        for _ in range(rng.randint(2, 6)):
            blocks.append(self._heading(rng, 2, topic))
            for _ in range(rng.randint(1, 3)):
                if rng.random() < 0.25:
                    blocks.append(self._heading(rng, 3, topic))
                roll = rng.random()
                blocks.append(self._code(rng, topic) if roll < 0.15 else self._list(rng, topic) if roll < 0.25 else self._paragraph(rng, topic))
        return Document(doc_id=f"syn-{self.seed}-{i:07d}", title=title, text="\n\n".join(blocks) + "\n")

    def documents(self, count: int | None = None) -> Iterator[Document]:
        for i in itertools.count() if count is None else range(count):
            yield self.document(i)

    def chunks(self, n: int, *, max_chars: int = 1200, overlap: int = 1) -> Iterator[Chunk]:
        """The first ``n`` chunks of the corpus, streamed (documents are generated as needed)."""
        if n <= 0:
            return
        produced = 0
        for doc in self.documents():
            for c in chunker.chunk(doc, max_chars=max_chars, overlap=overlap):
                yield c
                produced += 1
                if produced == n:
                    return

    def queries(self, count: int, *, seed: int = 1, words: tuple[int, int] = (2, 4)) -> list[str]:
        """``count`` queries of 2-4 content words: about one topic (each word from it with
        probability 0.7) when the corpus has topics, else drawn with the corpus-wide Zipf law."""
        rng = random.Random(f"queries:{self.seed}:{seed}")
        out = []
        for _ in range(count):
            k = rng.randint(*words)
            topic = rng.randrange(len(self.topics)) if self.topics else None
            out.append(" ".join(self._content_words(rng, k, topic, share=0.7)))
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print synthetic documents, or statistics of the first N chunks.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--docs", type=int, default=1, help="documents to print")
    parser.add_argument("--chunks", type=int, default=0, help="with --stats: chunks to generate")
    parser.add_argument("--stats", action="store_true")
    parser.add_argument("--topics", type=int, default=300, help="0: every word independent (the worst case)")
    args = parser.parse_args(argv)
    corpus = Corpus(args.seed, topics=args.topics)
    if not args.stats:
        for doc in corpus.documents(args.docs):
            print(doc.text)
        return 0
    import collections
    import time

    start = time.perf_counter()
    chunks = list(corpus.chunks(args.chunks))
    seconds = time.perf_counter() - start
    docs = collections.Counter(c.doc_id for c in chunks)
    sizes = sorted(len(c.text) for c in chunks)
    print(f"{len(chunks)} chunks from {len(docs)} documents in {seconds:.1f} s; chunk chars "
          f"p50 {sizes[len(sizes) // 2]} max {sizes[-1]}; {sum(len(c.text) for c in chunks) / 1e6:.1f} M chars; "
          f"distinct texts {len({c.text for c in chunks})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
