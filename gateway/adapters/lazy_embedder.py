"""A local `Embedder` loaded on first use, not at start-up.

The local model's ONNX Runtime session holds ~135 MB (its int8 weights folded into floats, BENCHMARKS.md
issue 29): a gateway that has embedded nothing yet holds none of it. The first call (a request's
question, or the first embed job) loads it in a worker thread; calls arriving meanwhile wait for that one
load. A load that fails raises `EmbeddingError` to its caller (the request goes on without retrieval by
meaning; a job is retried) and is tried again by the next call. What names the model's vectors (its id,
similarity bands and dimensions) is known without loading it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.adapters.lazy_index import OpenedOnFirstUse
from gateway.errors import EmbeddingError
from gateway.ports import Embedder, Similarity


class LazyEmbedder:
    def __init__(
        self, model: str, similarity: Similarity, dimensions: int, load: Callable[[], Embedder]
    ) -> None:
        self._model = model
        self._similarity = similarity
        self._dimensions = dimensions
        self._embedder = OpenedOnFirstUse(load, lambda: EmbeddingError("the embedder is closed"))

    @property
    def loaded(self) -> bool:
        return self._embedder.opened

    @property
    def model(self) -> str:
        return self._model

    @property
    def similarity(self) -> Similarity:
        return self._similarity

    @property
    def dimensions(self) -> int:
        return self._dimensions

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return await (await self._embedder.get()).embed(texts)

    async def embed_query(self, text: str) -> list[float]:
        return await (await self._embedder.get()).embed_query(text)

    async def aclose(self) -> None:
        await self._embedder.aclose()
