"""HashEmbedder's token table: every distinct token hashed once per process, and its signed codes.

Contract: ``_TokenTable.token_codes(words, counts, dims)`` returns ``text * 2 * dims + signed code``
of every token occurrence of consecutive texts (words, bigrams of consecutive words, character
trigrams; blake2b, 8-byte digest read big-endian; code ``h % dims``, ``+ dims`` when the top bit
is set: ``embed``'s recipe), hashing only the tokens the table has not met; callers hold its
``lock``. ``_IntMap`` is the numpy hash table of int keys it looks bigrams and trigrams up in.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from itertools import compress, repeat

import numpy as np

_BLAKE2B_8 = hashlib.blake2b(digest_size=8)  # copied for every token: cheaper than a new hasher


def _blake2b64(parts: Iterable[bytes], more: Iterable[bytes] | None = None) -> np.ndarray:
    """The recipe's hash of each token as uint64, the token given as bytes (or as two halves,
    ``parts[i] + more[i]``, hashed without joining them): one ``np.frombuffer`` for all digests."""
    copy = _BLAKE2B_8.copy
    digests: list[bytes] = []
    append = digests.append
    if more is None:
        for token in parts:
            hasher = copy()
            hasher.update(token)
            append(hasher.digest())
    else:
        for head, tail in zip(parts, more):
            hasher = copy()
            hasher.update(head)
            hasher.update(tail)
            append(hasher.digest())
    return np.frombuffer(b"".join(digests), dtype=">u8").astype(np.uint64)


def _grow(array: np.ndarray, size: int) -> np.ndarray:
    """``array`` with room for at least ``size`` items (capacity doubles; contents kept)."""
    if size <= len(array):
        return array
    bigger = np.empty(max(size, 2 * len(array)), dtype=array.dtype)
    bigger[: len(array)] = array
    return bigger


_EMPTY = -1
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)


class _IntMap:
    """Non-negative int64 keys -> int64 values: an open-addressing hash table held in numpy.

    Fibonacci hashing, linear probing, at most half full, no deletion. ``get`` and ``put`` take
    whole arrays, one numpy step per probe, so the bigrams and trigrams of a batch are resolved
    without a Python step per occurrence (a dict of int keys ``a << 32 | b`` would also collide
    on the low bits).
    """

    def __init__(self, bits: int = 15):
        self._allocate(bits)

    def _allocate(self, bits: int) -> None:
        self.bits = bits
        self.keys = np.full(1 << bits, _EMPTY, dtype=np.int64)
        self.values = np.empty(1 << bits, dtype=np.int64)
        self.size = 0

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.view(np.uint64) * _FIBONACCI) >> np.uint64(64 - self.bits)).astype(np.int64)

    def get(self, keys: np.ndarray) -> np.ndarray:
        """The value of each key, -1 where absent (a key sits before the first empty slot of its
        probe sequence, as nothing is ever removed)."""
        mask = (1 << self.bits) - 1
        slot = self._slots(keys)
        found = self.keys[slot]
        hit = found == keys
        out = np.where(hit, self.values[slot], -1)  # the first probe settles almost every key
        todo = np.flatnonzero(~hit & (found != _EMPTY))
        slot = (slot[todo] + 1) & mask
        while len(todo):
            found = self.keys[slot]
            hit = found == keys[todo]
            out[todo[hit]] = self.values[slot[hit]]
            go_on = ~hit & (found != _EMPTY)
            todo, slot = todo[go_on], (slot[go_on] + 1) & mask
        return out

    def put(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Insert distinct keys that are not in the map."""
        if 2 * (self.size + len(keys)) > (1 << self.bits):
            held = self.keys != _EMPTY
            keys, values = np.concatenate([self.keys[held], keys]), np.concatenate([self.values[held], values])
            bits = self.bits
            while 2 * len(keys) > (1 << bits):
                bits += 1
            self._allocate(bits)
        self.size += len(keys)
        todo = np.arange(len(keys))
        slot = self._slots(keys)
        mask = (1 << self.bits) - 1
        while len(todo):
            free = self.keys[slot] == _EMPTY
            self.keys[slot[free]] = keys[todo[free]]  # of the keys aiming at one free slot, one lands
            won = self.keys[slot] == keys[todo]
            self.values[slot[won]] = values[todo[won]]
            todo, slot = todo[~won], (slot[~won] + 1) & mask


class _TokenTable:
    """The process-wide token cache shared by every HashEmbedder, whatever its dims.

    Each distinct token is hashed once per process and its 64-bit blake2b value kept in
    ``hashes`` (one row per token); the value does not depend on dims. The signed codes of one
    dims (``h % dims``, ``+ dims`` when the top bit is set) are derived in numpy, once per row,
    and kept in ``codes``.

    - ``words``: a word -> word id; ``members[ptr[id]:ptr[id + 1]]`` are the rows of the word and
      of each of its trigrams, in order (repeats kept: ``aaaa`` has ``aaa`` twice).
    - ``trigrams``: ``c0 << 42 | c1 << 21 | c2`` (code points) -> row of that trigram.
    - ``pairs``: ``first word id << 32 | second word id`` -> row of the bigram ``"first second"``.
    - ``spaced`` and ``encoded``: each word id's UTF-8 bytes with and without a trailing space,
      which hash a new bigram without building its string.

    Bounded: when more than ``limit`` rows are held at the start of a part of a batch, everything
    is dropped and refilled by later parts (a generation reset; a per-token LRU would cost a
    Python step per token on every hit, which is the work this cache removes); one part
    (``HashEmbedder._PART_CHARS`` characters) can add its own new tokens beyond the limit. A
    row costs about 80-90 bytes in all (the word dict, the maps, the arrays and their spare
    capacity), so the default limit of 1,000,000 rows is about 90 MB.

    ``lock`` guards every read and write (callers hold it), so embedders in several threads
    share one table (tokenising and the final bincount run outside it); ``os.register_at_fork``
    holds it across a fork, so a child never inherits a half-written table.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        self.words: dict[str, int] = {}
        self.encoded: list[bytes] = []
        self.spaced: list[bytes] = []
        self.trigrams = _IntMap()
        self.pairs = _IntMap()
        self.hashes = np.empty(1 << 15, dtype=np.uint64)
        self.rows = 0
        self.ptr = np.zeros(1 << 12, dtype=np.int64)  # ptr[0] = 0; ptr[i + 1] ends word i's members
        self.members = np.empty(1 << 15, dtype=np.int64)
        # dims -> (signed code of each row, rows done, code of each member, members done)
        self.codes: dict[int, tuple[np.ndarray, int, np.ndarray, int]] = {}

    def __len__(self) -> int:
        return self.rows

    def _append_rows(self, hashes: np.ndarray) -> int:
        """Store new tokens' hashes as rows ``self.rows ...``; returns the first new row."""
        first = self.rows
        self.hashes = _grow(self.hashes, first + len(hashes))
        self.hashes[first : first + len(hashes)] = hashes
        self.rows = first + len(hashes)
        return first

    def _add_words(self, new_words: list[str]) -> None:
        """Give each new word an id and, as its members, its own row and the rows of its trigrams.

        Trigrams are found in numpy: the words' code points (UTF-32) side by side give one key
        ``c0 << 42 | c1 << 21 | c2`` per trigram (code points fit in 21 bits), looked up in
        ``trigrams``; only the unseen keys are cut out of the joined words and hashed.
        """
        count = len(new_words)
        joined = "".join(new_words)
        points = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        lengths = np.fromiter(map(len, new_words), dtype=np.int64, count=count)
        n_trigrams = np.maximum(lengths - 2, 0)
        at = np.repeat(np.cumsum(lengths) - lengths - (np.cumsum(n_trigrams) - n_trigrams), n_trigrams)
        at += np.arange(len(at), dtype=np.int64)  # where each trigram starts in ``joined``
        keys = (points[at] << 42) | (points[at + 1] << 21) | points[at + 2]
        trigram_rows = self.trigrams.get(keys)
        missing = trigram_rows < 0
        if missing.any():
            new, first_seen, where = np.unique(keys[missing], return_index=True, return_inverse=True)
            fresh = self._append_rows(_blake2b64(joined[i : i + 3].encode() for i in at[missing][first_seen].tolist()))
            self.trigrams.put(new, np.arange(fresh, fresh + len(new), dtype=np.int64))
            trigram_rows[missing] = fresh + where.reshape(-1)
        encoded = [w.encode() for w in new_words]
        word_rows = self._append_rows(_blake2b64(encoded)) + np.arange(count, dtype=np.int64)
        sizes = n_trigrams + 1
        own = np.cumsum(sizes) - sizes  # a word's own row comes first among its members
        members = np.empty(int(sizes.sum()), dtype=np.int64)
        is_trigram = np.ones(len(members), dtype=bool)
        is_trigram[own] = False
        members[own] = word_rows
        members[is_trigram] = trigram_rows
        first_id = len(self.encoded)
        self.words.update(zip(new_words, range(first_id, first_id + count)))
        self.encoded.extend(encoded)
        self.spaced.extend([e + b" " for e in encoded])
        self.ptr = _grow(self.ptr, first_id + count + 1)
        end = int(self.ptr[first_id])
        self.ptr[first_id + 1 : first_id + count + 1] = end + np.cumsum(sizes)
        self.members = _grow(self.members, end + len(members))
        self.members[end : end + len(members)] = members

    def word_ids(self, words: list[str]) -> np.ndarray:
        """The word id of every word occurrence (new words added): the one Python step per word."""
        ids = np.fromiter(map(self.words.get, words, repeat(-1)), dtype=np.int64, count=len(words))
        missing = ids < 0
        if missing.any():
            absent = list(compress(words, missing))
            self._add_words(list(dict.fromkeys(absent)))
            ids[missing] = np.fromiter(map(self.words.__getitem__, absent), dtype=np.int64, count=len(absent))
        return ids

    def pair_rows(self, keys: np.ndarray) -> np.ndarray:
        """The row of every bigram occurrence, given as ``first id << 32 | second id`` (new bigrams added)."""
        rows = self.pairs.get(keys)
        missing = rows < 0
        if missing.any():
            new, where = np.unique(keys[missing], return_inverse=True)
            heads = map(self.spaced.__getitem__, (new >> 32).tolist())
            tails = map(self.encoded.__getitem__, (new & 0xFFFFFFFF).tolist())
            fresh = self._append_rows(_blake2b64(heads, tails))
            self.pairs.put(new, np.arange(fresh, fresh + len(new), dtype=np.int64))
            rows[missing] = fresh + where.reshape(-1)
        return rows

    def signed_codes(self, dims: int) -> tuple[np.ndarray, np.ndarray]:
        """(signed code of each row, of each word member) for ``dims``: index, + dims for a set top bit."""
        empty = np.empty(0, dtype=np.int64)
        codes, rows_done, member_codes, members_done = self.codes.get(dims, (empty, 0, empty, 0))
        if rows_done < self.rows:
            h = self.hashes[rows_done : self.rows]
            codes = _grow(codes, self.rows)
            fresh = codes[rows_done : self.rows]
            np.remainder(h, np.uint64(dims), out=fresh, casting="unsafe")
            fresh += (h >> np.uint64(63)).astype(np.int64) * dims
        n_members = int(self.ptr[len(self.encoded)])
        if members_done < n_members:
            member_codes = _grow(member_codes, n_members)
            member_codes[members_done:n_members] = codes[self.members[members_done:n_members]]
        self.codes[dims] = codes, self.rows, member_codes, n_members
        return codes, member_codes

    def token_codes(self, words: list[str], counts: np.ndarray, dims: int) -> np.ndarray:
        """``text * 2 * dims + signed code`` of every token occurrence of consecutive texts.

        ``counts[i]`` words of ``words`` belong to text ``i``. Every occurrence of a word yields
        the word and its trigrams (its members); every two consecutive words of one text a bigram.
        """
        if len(self) > self.limit:
            self.clear()
        text = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        ids = self.word_ids(words)
        same = text[:-1] == text[1:]
        pair_rows = self.pair_rows((ids[:-1][same] << 32) | ids[1:][same])
        codes, member_codes = self.signed_codes(dims)
        width = 2 * dims  # a text's stretch of the flat (texts, 2 * dims) counts
        # member positions word after word: ptr[id], ptr[id] + 1, ... as one cumsum of steps
        starts, ends = self.ptr[ids], self.ptr[ids + 1]
        done = np.cumsum(ends - starts)  # members of the words up to each one
        steps = np.ones(int(done[-1]) if len(done) else 0, dtype=np.int64)
        steps[done[:-1]] = starts[1:] - ends[:-1] + 1
        steps[:1] = starts[:1]
        per_text = np.diff(np.concatenate([[0], done])[np.cumsum(counts)], prepend=0)
        word_part = member_codes[np.cumsum(steps)] + np.repeat(np.arange(len(counts), dtype=np.int64) * width, per_text)
        return np.concatenate([word_part, codes[pair_rows] + text[:-1][same] * width])
