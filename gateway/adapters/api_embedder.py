"""An `Embedder` over a provider's `/v1/embeddings`, reached through the tenant's own `Upstream` adapter.

The upstream supplies the base URL, the key and the connection pool; this module only shapes the batches
and checks what comes back, so a provider's answer never reaches the index unverified.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import orjson

from gateway.errors import EmbeddingError, NotSupported, UpstreamError
from gateway.ports import JSON, Headers, Similarity, Upstream

# `forward` passes bodies through undecoded, so ask for an uncompressed answer.
_HEADERS: Headers = [("content-type", "application/json"), ("accept-encoding", "identity")]
EXCERPT_CHARS = 200


class ApiEmbedder:
    """Batches of `batch_size` texts, sent one after another (a background job need not flood the
    provider); vectors are re-normalised, since not every OpenAI-compatible server normalises.

    Texts longer than `max_input_tokens` (counted with `count`, e.g. the model's tiktoken encoding) are
    cut to fit: providers refuse over-long inputs, and one pasted document would otherwise fail the whole
    batch, leaving its exchange without vectors. The start of a message says what it is about."""

    def __init__(
        self,
        upstream: Upstream,
        model: str,
        dimensions: int,
        batch_size: int = 64,
        *,
        max_input_tokens: int = 8_000,
        count: Callable[[str], int] | None = None,
    ) -> None:
        if dimensions < 1 or batch_size < 1 or max_input_tokens < 1:
            raise ValueError("dimensions, batch_size and max_input_tokens must be at least 1")
        self._upstream = upstream
        self._model = model
        self._dimensions = dimensions
        self.batch_size = batch_size
        self._max_tokens = max_input_tokens
        self._count = count or _utf8_bytes

    @property
    def similarity(self) -> Similarity:
        return Similarity()  # a provider's model, not measured here: MiniLM's bands

    @property
    def model(self) -> str:
        return self._model

    @property
    def dimensions(self) -> int:
        return self._dimensions

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(await self._batch(texts[start : start + self.batch_size]))
        return vectors

    async def _batch(self, texts: Sequence[str]) -> list[list[float]]:
        # OpenAI rejects an empty string as input; a lone space embeds as "no content" instead of failing
        # the whole batch (an assistant turn made only of tool calls has empty text).
        inputs = [_fit(text, self._max_tokens, self._count) or " " for text in texts]
        body = orjson.dumps({"model": self._model, "input": inputs})
        where = f"embeddings from {self._upstream.name!r} (model {self._model!r})"
        try:
            response = await self._upstream.forward(
                "POST", "/embeddings", "", _HEADERS, body, client_key=None
            )
            try:
                raw = await response.read()
            finally:
                await response.close()
        except (UpstreamError, NotSupported) as exc:
            raise EmbeddingError(f"{where} failed: {exc}") from exc
        if not 200 <= response.status < 300:
            raise EmbeddingError(f"{where} failed: HTTP {response.status}: {_excerpt(raw)}")
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise EmbeddingError(f"{where}: the answer is not JSON: {_excerpt(raw)}") from exc
        vectors = _vectors(answer, len(texts), where)
        if vectors.shape[1] != self._dimensions:
            raise EmbeddingError(
                f"{where}: got {vectors.shape[1]}-dimensional vectors, but {self._dimensions} are configured"
            )
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        normalised: list[list[float]] = (vectors / np.maximum(norms, 1e-12)).tolist()
        return normalised

    async def embed_query(self, text: str) -> list[float]:
        return (await self.embed([text]))[0]

    async def aclose(self) -> None:
        # The upstream belongs to its tenant, which closes it; it may be serving chats still.
        return None


def _utf8_bytes(text: str) -> int:
    """An upper bound on any byte-level tokenizer's count: a token holds at least one byte."""
    return len(text.encode())


def _fit(text: str, limit: int, count: Callable[[str], int]) -> str:
    """`text`, cut to at most `limit` tokens by `count`."""
    if len(text.encode()) <= limit:
        return text  # no byte-level tokenizer makes more tokens than bytes: nothing to count
    tokens = count(text)
    while tokens > limit:
        text = text[: max(int(len(text) * limit / tokens * 0.95), 1)]
        tokens = count(text)
    return text


def _vectors(answer: JSON, expected: int, where: str) -> npt.NDArray[np.float64]:
    """`data[*].embedding` in input order (by `index`), as one (expected, d) array, or EmbeddingError."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise EmbeddingError(f"{where}: the answer has no `data` list: {_excerpt(orjson.dumps(answer))}")
    if len(data) != expected:
        raise EmbeddingError(f"{where}: sent {expected} texts, got {len(data)} embeddings")
    rows: list[JSON] = [None] * expected
    for position, item in enumerate(data):
        if not isinstance(item, dict):
            raise EmbeddingError(f"{where}: data[{position}] is not an object")
        index = item.get("index", position)  # OpenAI always sends it; a few small servers do not
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < expected
            or rows[index] is not None
        ):
            raise EmbeddingError(f"{where}: data[{position}] has a missing, repeated or bad index {index!r}")
        rows[index] = item.get("embedding")
    if not all(isinstance(row, list) and row for row in rows):
        # A base64 string here means a server that ignores the default `encoding_format: float`.
        raise EmbeddingError(f"{where}: an `embedding` is not a non-empty list of numbers")
    try:
        # No dtype given: strings stay strings (dtype kind "U") instead of being parsed as numbers.
        array = np.array(rows)
    except ValueError as exc:  # ragged rows
        raise EmbeddingError(f"{where}: embeddings are not equal-length lists of numbers") from exc
    if array.ndim != 2 or array.dtype.kind not in "iuf":
        raise EmbeddingError(f"{where}: embeddings are not equal-length lists of numbers")
    vectors = array.astype(np.float64)
    if not np.isfinite(vectors).all():
        raise EmbeddingError(f"{where}: embeddings contain non-finite numbers")
    return vectors


def _excerpt(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").strip()
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."
