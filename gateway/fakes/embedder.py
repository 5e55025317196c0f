"""A deterministic stand-in `Embedder` for unit tests: hashed bag of words, no model, no threads.

Texts that share words get similar vectors (cosine = overlap of their word counts), so retrieval tests
can reason about rankings; every call is recorded, so batching is visible.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence

from gateway.errors import EmbeddingError
from gateway.ports import Similarity

_WORDS = re.compile(r"\w+")


class HashingEmbedder:
    """`HashingEmbedder(dimensions=64)`; set `fail = True` to make `embed` raise `EmbeddingError`."""

    def __init__(self, dimensions: int = 64) -> None:
        if dimensions < 1:
            raise ValueError("dimensions must be at least 1")
        self._dimensions = dimensions
        self.calls: list[list[str]] = []
        self.fail = False
        self.closed = False

    @property
    def model(self) -> str:
        return f"hashing-{self._dimensions}"

    @property
    def similarity(self) -> Similarity:
        return Similarity()

    @property
    def dimensions(self) -> int:
        return self._dimensions

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        if self.fail:
            raise EmbeddingError("HashingEmbedder was told to fail")
        return [self.vector(text) for text in texts]

    def vector(self, text: str) -> list[float]:
        """The vector `embed` gives `text`, for tests that compute expectations."""
        counts = [0.0] * self._dimensions
        # A text without words still gets a unit vector (the empty word's bucket): callers divide by norms.
        for word in _WORDS.findall(text.lower()) or [""]:
            # blake2b, not hash(): Python salts str hashes per process, and tests need stable vectors.
            digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
            counts[int.from_bytes(digest, "little") % self._dimensions] += 1.0
        norm = math.sqrt(sum(c * c for c in counts))
        return [c / norm for c in counts]

    async def embed_query(self, text: str) -> list[float]:
        return (await self.embed([text]))[0]

    async def aclose(self) -> None:
        self.closed = True
