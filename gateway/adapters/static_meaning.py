"""A ranking by meaning for a history whose vectors are not written yet, from word-piece vectors alone.

A long history that arrives in one request waits tens of seconds for the model's vectors (one core
embeds ~60 messages a second), and questions asked meanwhile were ranked by keyword alone: LoCoMo dev
90.5 % against 92.5 once embedded (BENCHMARKS.md, session 38). Here each text is the mean of its word
pieces' static vectors (`static_table.py`), each weighted by its inverse document frequency over the
texts ranked, and the question the same; ranked by cosine. No model runs: 675 texts took ~18 ms once
their word pieces were known (~90 ms the first time, tokenising them), 0.3 ms for the next question. Offline, over LoCoMo dev's first three conversations,
this ranked more evidence into the top 40 than the model's own vectors (74 % against 63 %), being in
part a keyword ranking that also matches related words.

The table is memory-mapped: only the rows of word pieces in use are read.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt
from tokenizers import BertWordPieceTokenizer

from gateway.adapters.onnx_embedder import VOCAB_FILE
from gateway.adapters.static_table import SCALE_FILE, TABLE_FILE, data_file

log = logging.getLogger(__name__)

# Texts whose word pieces are kept: a history in hand is ranked again for each question asked over it.
PIECED_TEXTS = 8_192
# Histories whose text vectors are kept (a few conversations indexing at once).
HISTORIES = 4
# A text's word pieces read at most (the model reads 256; a long tool result's first stretch says what it is).
MAX_PIECES = 512

Ints = npt.NDArray[np.uint16]  # word-piece ids: the vocabulary holds 30,522
Floats = npt.NDArray[np.float32]
_Loaded = tuple[BertWordPieceTokenizer, npt.NDArray[np.int8], Floats]
K = TypeVar("K")
V = TypeVar("V")


class _Kept(Generic[K, V]):
    """The last `bound()` entries put, thread-safe, and the bytes they hold (`size` of each)."""

    def __init__(self, bound: Callable[[], int], size: Callable[[V], int]) -> None:
        self._bound, self._size = bound, size
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        with self._lock:
            known = self._entries.get(key)
            if known is not None:
                self._entries.move_to_end(key)
            return known

    def put(self, key: K, value: V) -> None:
        with self._lock:
            if key not in self._entries:
                self._entries[key] = value
                self.bytes += self._size(value)
            while len(self._entries) > self._bound():
                self.bytes -= self._size(self._entries.popitem(last=False)[1])

    def values(self) -> list[V]:
        with self._lock:
            return list(self._entries.values())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0


@dataclass(frozen=True, slots=True)
class _History:
    vectors: Floats  # [texts, dims], unit length (zero for a text without pieces)
    idf: Floats  # per word piece, over these texts


@dataclass(slots=True)
class StaticMeaning:
    """`(question, texts, limit) -> [(index in texts, cosine)]`, best first; thread-safe."""

    table_path: Path | None = None
    scale_path: Path | None = None
    vocab_path: Path | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _histories: _Kept[tuple[int, int], _History] = field(
        default_factory=lambda: _Kept(lambda: HISTORIES, lambda h: h.vectors.nbytes + h.idf.nbytes),
        init=False,
        repr=False,
    )
    # Keyed by the text's hash, not the text: a tool result of 50 KB is not kept alive for its pieces.
    _pieced: _Kept[int, Ints] = field(
        default_factory=lambda: _Kept(lambda: PIECED_TEXTS, sys.getsizeof), init=False, repr=False
    )
    _loaded: _Loaded | None = field(default=None, init=False, repr=False)
    _failed: bool = field(default=False, init=False, repr=False)

    def cache_bytes(self) -> dict[str, int]:
        return {"static_pieces": self._pieced.bytes, "static_histories": self._histories.bytes}

    def __call__(self, question: str, texts: Sequence[str], limit: int) -> list[tuple[int, float]]:
        if limit <= 0 or not texts or self._load() is None:
            return []
        history = self._history(texts)
        asked = self._pieces(question)
        if not len(asked):
            return []
        query = self._mean(asked, history.idf)
        scores = history.vectors @ query
        matched = np.flatnonzero(scores > 0)
        if len(matched) > limit:
            matched = matched[np.argpartition(-scores[matched], limit - 1)[:limit]]
        order = matched[np.argsort(-scores[matched], kind="stable")]
        return [(int(i), float(scores[i])) for i in order]

    def _load(self) -> _Loaded | None:
        """The vocabulary and the table, loaded on first use (None, logged once, where they cannot be:
        the history in hand is then ranked by keyword alone)."""
        with self._lock:
            if self._loaded is None and not self._failed:
                try:
                    with ExitStack() as files:
                        vocab, table_path, scale_path = (
                            given or files.enter_context(data_file(name))
                            for given, name in (
                                (self.vocab_path, VOCAB_FILE),
                                (self.table_path, TABLE_FILE),
                                (self.scale_path, SCALE_FILE),
                            )
                        )
                        tokenizer = BertWordPieceTokenizer(str(vocab), lowercase=True)
                        table = np.load(table_path, mmap_mode="r")
                        scale = np.load(scale_path).astype(np.float32)
                    tokenizer.no_truncation()
                    tokenizer.no_padding()
                    if table.ndim != 2 or scale.shape != (len(table),):
                        raise ValueError(f"table {table.shape} and scales {scale.shape} do not match")
                    self._loaded = (tokenizer, table, scale)
                # numpy's and the tokenizers library's load errors share no narrower base.
                except Exception:
                    self._failed = True
                    log.exception(
                        "static word-piece vectors unavailable: histories in hand ranked by keyword"
                    )
            return self._loaded

    def _loaded_now(self) -> _Loaded:
        loaded = self._load()
        assert loaded is not None, "__call__ returns early without the table"
        return loaded

    def _pieces(self, text: str) -> Ints:
        known = self._pieced.get(hash(text))
        if known is not None:
            return known
        tokenizer, _, _ = self._loaded_now()
        ids = tokenizer.encode(text, add_special_tokens=False).ids[:MAX_PIECES]
        pieces: Ints = np.asarray(ids, dtype=np.uint16)
        self._pieced.put(hash(text), pieces)
        return pieces

    def _mean(self, pieces: Ints, idf: Floats) -> Floats:
        """The pieces' vectors, averaged with `idf` weights, at unit length."""
        _, table, scale = self._loaded_now()
        weights = idf[pieces] * scale[pieces]
        vector: Floats = (table[pieces].astype(np.float32) * weights[:, None]).sum(axis=0)
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm > 0 else vector

    def _history(self, texts: Sequence[str]) -> _History:
        key = (len(texts), hash(tuple(texts)))
        known = self._histories.get(key)
        if known is not None:
            return known
        _, table, _ = self._loaded_now()
        pieced = [self._pieces(t) for t in texts]
        df = np.zeros(len(table), dtype=np.float32)
        for pieces in pieced:
            df[np.unique(pieces)] += 1.0
        idf = (np.log((len(texts) + 1.0) / (df + 1.0)) + 1.0).astype(np.float32)
        vectors = np.zeros((len(texts), table.shape[1]), dtype=np.float32)
        for row, pieces in enumerate(pieced):
            if len(pieces):
                vectors[row] = self._mean(pieces, idf)
        history = _History(vectors, idf)
        self._histories.put(key, history)
        return history
