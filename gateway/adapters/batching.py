"""Local embedders' batching: texts in batches of similar length, results back in the caller's order."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence


async def in_length_order(
    texts: Sequence[str], batch_size: int, run: Callable[[list[str]], Awaitable[list[list[float]]]]
) -> list[list[float]]:
    """`run` over `texts` in batches of `batch_size`, longest first (each batch pads little); one vector
    per text, in the order of `texts`."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
    vectors: list[list[float]] = [[] for _ in texts]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        for i, row in zip(chunk, await run([texts[i] for i in chunk]), strict=True):
            vectors[i] = row
    return vectors
