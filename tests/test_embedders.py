"""Embedders: the real int8 MiniLM on onnxruntime, the API embedder against real loopback servers, the fake."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from importlib.resources import as_file, files
from pathlib import Path
from typing import TypeVar

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tokenizers import BertWordPieceTokenizer

from gateway.adapters.api_embedder import ApiEmbedder, _fit, _utf8_bytes
from gateway.adapters.lazy_embedder import LazyEmbedder
from gateway.adapters.onnx_embedder import OnnxEmbedder
from gateway.adapters.registry import EmbedderContext
from gateway.adapters.registry import embedder as registry_embedder
from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizers
from gateway.config import parse_config
from gateway.errors import EmbeddingError, UpstreamError
from gateway.fakes.embedder import HashingEmbedder
from gateway.fakes.server import BackgroundServer
from gateway.ports import Embedder, Similarity, Upstream
from gateway.wiring import build_upstream
from tests.conftest import Upstream as FakeServer
from tests.conftest import tenant

T = TypeVar("T")

SIMILAR = ("The cat sits on the mat", "A cat is sitting on a mat")
UNRELATED = "Quarterly revenue grew by 5%"
# Lengths that the embedder's longest-first sort reorders, so a lost permutation shows.
MIXED = [
    "short",
    "The deployment failed because the database migration timed out after thirty seconds.",
    "",
    "ok thanks",
    "Can you summarise what we decided about the budget for the Lisbon offsite in March?",
    "Héllo naïve café: unicode, accents and emoji 😀 survive tokenisation.",
    "Python's asyncio event loop must never block on CPU-bound work such as model inference.",
    "yes",
    "Remind me tomorrow at 9am to call the dentist about the appointment I moved last week.",
    "Vectors",
]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (
        math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    )


def norm(vector: Sequence[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await scenario()

    return asyncio.run(main())


# --- OnnxEmbedder: the genuine model ---------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx() -> OnnxEmbedder:
    return OnnxEmbedder.load(threads=1, batch_size=3)


def test_onnx_gives_unit_vectors_of_384_dimensions(onnx: OnnxEmbedder) -> None:
    vectors = run(lambda: onnx.embed(MIXED))
    assert (onnx.model, onnx.dimensions) == ("all-MiniLM-L6-v2-int8", 384)
    assert len(vectors) == len(MIXED)
    for vector in vectors:
        assert len(vector) == 384
        assert norm(vector) == pytest.approx(1.0, abs=1e-5)


def test_onnx_ranks_paraphrases_above_unrelated_text(onnx: OnnxEmbedder) -> None:
    cat, paraphrase, revenue = run(lambda: onnx.embed([*SIMILAR, UNRELATED]))
    # fp32 all-MiniLM-L6-v2 gives 0.973 and -0.013 for these pairs.
    assert cosine(cat, paraphrase) > 0.9
    assert cosine(cat, revenue) < 0.2


def test_onnx_batches_match_one_by_one_in_the_callers_order(onnx: OnnxEmbedder) -> None:
    batched = run(lambda: onnx.embed(MIXED))  # batch_size 3: four batches, sorted by length

    async def one_by_one() -> list[list[float]]:
        return [(await onnx.embed([text]))[0] for text in MIXED]

    single = run(one_by_one)
    for position, (got, expected) in enumerate(zip(batched, single, strict=True)):
        assert max(abs(x - y) for x, y in zip(got, expected, strict=True)) < 1e-4, MIXED[position]
    # The texts' vectors are far apart, so the comparison above would catch any reordering.
    assert max(cosine(single[i], single[j]) for i in range(len(MIXED)) for j in range(i)) < 0.9


def test_onnx_concurrent_calls_do_not_mix_results(onnx: OnnxEmbedder) -> None:
    first, second = MIXED[:5], MIXED[5:]

    async def scenario() -> tuple[list[list[float]], list[list[float]], list[list[float]]]:
        together = await asyncio.gather(onnx.embed(first), onnx.embed(second))
        return together[0], together[1], await onnx.embed(MIXED)

    a, b, alone = run(scenario)
    for got, expected in zip(a + b, alone, strict=True):
        assert max(abs(x - y) for x, y in zip(got, expected, strict=True)) < 1e-4


def _niceness_of_threads() -> dict[int, int]:
    """Each thread of this process and its niceness, as the kernel reports it (Linux)."""
    nice: dict[int, int] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile (ENOENT or ESRCH)
            continue
        nice[int(task.name)] = int(fields[16])  # stat's 19th field; [0] here is the 3rd (state)
    return nice


@pytest.mark.skipif(sys.platform != "linux", reason="a niceness per thread is Linux's")
def test_onnx_background_batches_run_on_a_nicer_thread_and_queries_do_not() -> None:
    embedder = OnnxEmbedder(threads=1, batch_size=8)
    process = os.getpriority(os.PRIO_PROCESS, 0)
    before = _niceness_of_threads()
    seen: dict[str, int] = {}
    run_texts = embedder._run

    def on(lane: str) -> Callable[[list[str]], object]:
        def recorded(texts: list[str]) -> object:
            seen[lane] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            return run_texts(texts)

        return recorded

    try:
        embedder._run = on("batch")  # type: ignore[method-assign]
        run(lambda: embedder.embed(MIXED))
        embedder._run = on("query")  # type: ignore[method-assign]
        run(lambda: embedder.embed_query("which port did we pick for staging?"))
        assert seen == {"batch": min(process + 10, 19), "query": process}
        # One new thread, nicer (the batches'); the threads there before were not touched.
        after = _niceness_of_threads()
        assert len({tid for tid, n in after.items() if n != process and tid not in before}) == 1
        assert all(after[tid] == n for tid, n in before.items() if tid in after)
    finally:
        run(embedder.aclose)


def test_onnx_query_lane_runs_beside_a_background_batch() -> None:
    embedder = OnnxEmbedder(threads=1, batch_size=64)  # one long batch of 64
    texts = [f"background message number {i} about the deployment of the billing service" for i in range(64)]
    query = "which port did we pick for staging?"
    finished: list[str] = []

    async def scenario() -> tuple[list[float], list[float]]:
        async def background() -> None:
            await embedder.embed(texts)
            finished.append("batch")

        task = asyncio.ensure_future(background())
        await asyncio.sleep(0.02)  # the batch is running in its worker thread
        vector = await embedder.embed_query(query)
        finished.append("query")
        await task
        return vector, (await embedder.embed([query]))[0]

    vector, batched = run(scenario)
    assert finished == ["query", "batch"]  # it did not wait for the batch to end
    assert cosine(vector, batched) > 0.9999


def test_onnx_truncates_at_256_word_pieces(onnx: OnnxEmbedder) -> None:
    words = [
        "memory",
        "vector",
        "budget",
        "summary",
        "lisbon",
        "meeting",
        "python",
        "database",
        "window",
        "token",
    ]
    long_text = " ".join(words[i % len(words)] + str(i) for i in range(600))
    with as_file(files("gateway.adapters") / "data" / "all-MiniLM-L6-v2-vocab.txt") as vocab:
        pieces = BertWordPieceTokenizer(str(vocab), lowercase=True).encode(long_text)
    assert len(pieces.ids) > 1000  # far beyond the limit; [CLS] + 254 pieces + [SEP] is what fits

    def prefix(count: int) -> str:
        return long_text[: pieces.offsets[count][1]]  # offsets[0] is [CLS]: piece `count` ends here

    whole, kept, shorter = run(lambda: onnx.embed([long_text, prefix(254), prefix(128)]))
    assert max(abs(x - y) for x, y in zip(whole, kept, strict=True)) < 1e-4
    assert max(abs(x - y) for x, y in zip(whole, shorter, strict=True)) > 1e-3


def test_onnx_empty_input_and_empty_strings(onnx: OnnxEmbedder) -> None:
    assert run(lambda: onnx.embed([])) == []
    (empty,) = run(lambda: onnx.embed([""]))
    assert norm(empty) == pytest.approx(1.0, abs=1e-5)


def test_onnx_inference_leaves_the_event_loop_free() -> None:
    embedder = OnnxEmbedder.load(threads=1, batch_size=64)
    texts = [
        f"Message {i}: " + "the assistant explained how the gateway compacts long chats " * 6
        for i in range(64)
    ]

    async def scenario() -> tuple[float, float]:
        gaps: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        task = asyncio.create_task(ticker())
        started = time.perf_counter()
        await embedder.embed(texts)
        elapsed = time.perf_counter() - started
        done.set()
        await task
        return elapsed, max(gaps)

    elapsed, worst_gap = run(scenario)
    assert elapsed > 0.2  # one batch of 64 long texts: long enough that blocking the loop would show
    # Blocked, the loop would miss one gap as long as the whole batch; a busy machine (other processes on
    # both cores) stretches gaps to a tenth of a second or two, so the bound is a share of the batch.
    assert worst_gap < elapsed / 4


def test_onnx_load_failures_are_embedding_errors(tmp_path: Path) -> None:
    garbage = tmp_path / "model.onnx"
    garbage.write_bytes(b"not a protobuf")
    with pytest.raises(EmbeddingError, match="cannot load"):
        OnnxEmbedder(model_path=tmp_path / "missing.onnx")
    with pytest.raises(EmbeddingError, match="cannot load"):
        OnnxEmbedder(model_path=garbage)
    with pytest.raises(EmbeddingError, match="cannot load"):
        OnnxEmbedder(vocab_path=tmp_path / "missing-vocab.txt")


def test_the_local_model_is_loaded_by_its_first_call_and_a_failed_load_is_tried_again() -> None:
    """The built-in model is named without loading it (its index table needs the name at start-up); the
    first call loads it once, concurrent first calls share that load, and a load that failed raises
    `EmbeddingError` to its caller and is tried again by the next."""
    config = parse_config({"tenants": [tenant("acme", "http://127.0.0.1:9/v1")]}, {})
    context = EmbedderContext(config, build_upstream(config.tenants[0]), TiktokenTokenizers())
    local = registry_embedder(config.tenants[0].retrieval.embedder, context)
    assert isinstance(local, LazyEmbedder) and not local.loaded
    assert (local.model, local.dimensions) == ("all-MiniLM-L6-v2-int8", 384)

    async def first_calls() -> list[list[float]]:
        return list(await asyncio.gather(*(local.embed_query(text) for text in SIMILAR)))

    vectors = asyncio.run(first_calls())
    assert local.loaded and [len(v) for v in vectors] == [384, 384]
    assert abs(math.fsum(x * x for x in vectors[0]) - 1.0) < 1e-4
    asyncio.run(local.aclose())

    loads: list[int] = []

    def flaky() -> Embedder:
        loads.append(1)
        if len(loads) == 1:
            raise EmbeddingError("cannot load the local embedding model: disk not ready")
        return HashingEmbedder(384)

    lazy = LazyEmbedder("m", Similarity(), 384, flaky)
    with pytest.raises(EmbeddingError, match="disk not ready"):
        asyncio.run(lazy.embed(["a"]))
    assert not lazy.loaded and len(asyncio.run(lazy.embed(["a", "b"]))) == 2 and len(loads) == 2


def test_onnx_closed_embedder_raises_embedding_error() -> None:
    embedder = OnnxEmbedder.load()

    async def scenario() -> None:
        assert len(await embedder.embed(["still open"])) == 1
        await embedder.aclose()
        await embedder.embed(["closed now"])

    with pytest.raises(EmbeddingError, match="closed"):
        run(scenario)


# --- ApiEmbedder: through the tenant's real upstream adapter ---------------------------------------


def tenant_upstream(base_url: str) -> Upstream:
    config = parse_config({"tenants": [tenant("acme", base_url)]}, {})
    return build_upstream(config.tenants[0])


def expected_fake_vector(text: str) -> list[float]:
    """What FakeUpstream answers for `text` ([len % 7, 0.5, -0.25]), normalised."""
    raw = [float(len(text) % 7), 0.5, -0.25]
    return [x / norm(raw) for x in raw]


def test_api_embedder_sends_batches_and_keeps_order(upstream: FakeServer) -> None:
    texts = ["a", "bb", "ccc", "dddd", "eeeee"]

    async def scenario() -> list[list[float]]:
        adapter = tenant_upstream(upstream.base_url)
        try:
            return await ApiEmbedder(adapter, "text-embedding-3-small", 3, batch_size=2).embed(texts)
        finally:
            await adapter.aclose()

    vectors = run(scenario)
    requests = upstream.fake.received
    assert [r.path for r in requests] == ["/v1/embeddings"] * 3
    assert [r.body["input"] for r in requests] == [["a", "bb"], ["ccc", "dddd"], ["eeeee"]]
    assert {r.body["model"] for r in requests} == {"text-embedding-3-small"}
    assert requests[0].headers["authorization"] == "Bearer sk-upstream"
    assert requests[0].headers["content-type"] == "application/json"
    for text, vector in zip(texts, vectors, strict=True):
        assert vector == pytest.approx(expected_fake_vector(text), abs=1e-12)
        assert norm(vector) == pytest.approx(1.0, abs=1e-12)


def test_api_embedder_empty_input_and_empty_strings(upstream: FakeServer) -> None:
    async def scenario() -> tuple[list[list[float]], list[list[float]]]:
        adapter = tenant_upstream(upstream.base_url)
        try:
            embedder = ApiEmbedder(adapter, "m", 3)
            return await embedder.embed([]), await embedder.embed(["", "x"])
        finally:
            await adapter.aclose()

    nothing, vectors = run(scenario)
    assert nothing == []
    # One request only (the empty call sent none); the empty string went out as a space.
    assert [r.body["input"] for r in upstream.fake.received] == [[" ", "x"]]
    assert vectors == [pytest.approx(expected_fake_vector(" ")), pytest.approx(expected_fake_vector("x"))]


def test_api_embedder_rejects_unexpected_dimensions(upstream: FakeServer) -> None:
    async def scenario() -> None:
        adapter = tenant_upstream(upstream.base_url)
        try:
            await ApiEmbedder(adapter, "m", 384).embed(["hello"])
        finally:
            await adapter.aclose()

    with pytest.raises(EmbeddingError, match=r"got 3-dimensional vectors, but 384 are configured"):
        run(scenario)


class ScriptedEmbeddings:
    """A /v1/embeddings endpoint answering with scripted (status, body) pairs; echoes 2-d vectors after."""

    def __init__(self) -> None:
        self.script: deque[Callable[[list[str]], tuple[int, bytes]]] = deque()

    async def embeddings(self, request: Request) -> Response:
        inputs = orjson.loads(await request.body())["input"]
        if self.script:
            status, body = self.script.popleft()(inputs)
            return Response(body, status_code=status, media_type="application/json")
        data = [{"index": i, "embedding": [float(len(t)), 1.0]} for i, t in enumerate(inputs)]
        return Response(orjson.dumps({"data": data}), media_type="application/json")

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/embeddings", self.embeddings, methods=["POST"])])


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedEmbeddings, str]]:
    fake = ScriptedEmbeddings()
    with BackgroundServer(fake.app()) as server:
        yield fake, f"{server.url}/v1"


def embed_via(base_url: str, texts: list[str], dimensions: int = 2) -> list[list[float]]:
    async def scenario() -> list[list[float]]:
        adapter = tenant_upstream(base_url)
        try:
            return await ApiEmbedder(adapter, "m", dimensions).embed(texts)
        finally:
            await adapter.aclose()

    return run(scenario)


def test_api_embedder_orders_by_index_and_normalises(scripted: tuple[ScriptedEmbeddings, str]) -> None:
    fake, base_url = scripted

    def shuffled(inputs: list[str]) -> tuple[int, bytes]:
        data = [{"index": i, "embedding": [float(len(t)), 2.0]} for i, t in enumerate(inputs)]
        return 200, orjson.dumps({"object": "list", "data": [data[1], data[2], data[0]]})

    fake.script.append(shuffled)
    vectors = embed_via(base_url, ["a", "bbbb", "cccccccc"])
    assert vectors == [
        pytest.approx([1 / norm([1.0, 2.0]), 2 / norm([1.0, 2.0])]),
        pytest.approx([4 / norm([4.0, 2.0]), 2 / norm([4.0, 2.0])]),
        pytest.approx([8 / norm([8.0, 2.0]), 2 / norm([8.0, 2.0])]),
    ]
    # A zero vector stays zero rather than turning into NaNs.
    fake.script.append(lambda inputs: (200, orjson.dumps({"data": [{"index": 0, "embedding": [0, 0]}]})))
    assert embed_via(base_url, ["nothing"]) == [[0.0, 0.0]]


def one(status: int, body: bytes) -> Callable[[list[str]], tuple[int, bytes]]:
    return lambda inputs: (status, body)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (one(500, b'{"error": {"message": "model overloaded"}}'), r"HTTP 500: .*model overloaded"),
        (one(429, b"x" * 5000), r"HTTP 429: x{200}\.\.\.$"),
        (one(200, b"<html>not json</html>"), r"not JSON: <html>not json</html>"),
        (one(200, b'{"object": "list"}'), r"no `data` list"),
        (one(200, b'{"data": [{"index": 0, "embedding": [1.0, 0.0]}]}'), r"sent 2 texts, got 1 embeddings"),
        (
            one(200, b'{"data": [{"index": 0, "embedding": [1, 0]}, {"index": 0, "embedding": [0, 1]}]}'),
            r"repeated or bad index 0",
        ),
        (
            one(200, b'{"data": [{"index": 0, "embedding": "AAAA"}, {"index": 1, "embedding": "AAAA"}]}'),
            r"not a non-empty list",
        ),
        (
            one(200, b'{"data": [{"index": 0, "embedding": [1, 0]}, {"index": 1, "embedding": [1]}]}'),
            r"not equal-length lists",
        ),
        (
            one(200, b'{"data": [{"index": 0, "embedding": ["1", "0"]}, {"index": 1, "embedding": [1, 0]}]}'),
            r"not equal-length lists of numbers",
        ),
    ],
)
def test_api_embedder_bad_answers_are_embedding_errors(
    scripted: tuple[ScriptedEmbeddings, str], answer: Callable[[list[str]], tuple[int, bytes]], message: str
) -> None:
    fake, base_url = scripted
    fake.script.append(answer)
    with pytest.raises(EmbeddingError, match=message):
        embed_via(base_url, ["hello", "world"])


def test_api_embedder_unreachable_upstream_is_embedding_error() -> None:
    server = BackgroundServer(ScriptedEmbeddings().app()).start()
    base_url = f"{server.url}/v1"
    assert embed_via(base_url, ["reachable"]) == [pytest.approx([9 / norm([9.0, 1.0]), 1 / norm([9.0, 1.0])])]
    server.stop()
    with pytest.raises(EmbeddingError, match="failed") as caught:
        embed_via(base_url, ["gone"])
    assert isinstance(caught.value.__cause__, UpstreamError)


# --- HashingEmbedder: the fake ----------------------------------------------------------------------


def test_hashing_embedder_shares_words_and_records_calls() -> None:
    fake = HashingEmbedder(dimensions=64)
    texts = ["The cat sat on the mat", "the CAT sat", "quarterly revenue report", ""]
    cat, cat_again, revenue, empty = run(lambda: fake.embed(texts))
    assert fake.calls == [texts]
    assert cosine(cat, cat_again) > 0.6 > cosine(cat, revenue)
    for vector in (cat, cat_again, revenue, empty):
        assert len(vector) == 64
        assert norm(vector) == pytest.approx(1.0)
    assert (fake.model, fake.dimensions) == ("hashing-64", 64)


def test_hashing_embedder_is_stable_across_processes() -> None:
    code = "from gateway.fakes.embedder import HashingEmbedder; print(HashingEmbedder(16).vector('Hello, hash world'))"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert outputs == {f"{HashingEmbedder(16).vector('Hello, hash world')}\n"}


def test_hashing_embedder_can_fail() -> None:
    fake = HashingEmbedder()
    fake.fail = True
    with pytest.raises(EmbeddingError):
        run(lambda: fake.embed(["x"]))
    assert fake.calls == [["x"]]


def test_api_embedder_cuts_texts_a_provider_would_refuse(upstream: FakeServer) -> None:
    upstream.fake.max_embedding_words = 50  # as a provider refuses inputs over its context length
    tokenizer = TiktokenTokenizers().for_model("text-embedding-3-small")
    document = " ".join(f"line {i} of the pasted deployment log" for i in range(400))  # ~2,800 words
    texts = ["short question", document, "Ünïcödé ✓ " * 30]

    async def scenario(limit: int | None) -> list[list[float]]:
        adapter = tenant_upstream(upstream.base_url)
        try:
            if limit is None:
                return await ApiEmbedder(adapter, "text-embedding-3-small", 3).embed(texts)
            embedder = ApiEmbedder(
                adapter, "text-embedding-3-small", 3, max_input_tokens=limit, count=tokenizer.count
            )
            return await embedder.embed(texts)
        finally:
            await adapter.aclose()

    with pytest.raises(EmbeddingError, match=r"HTTP 400: .*longer than 50 words"):
        run(lambda: scenario(None))  # the default limit (8,000 tokens) is the provider's, not this fake's
    vectors = run(lambda: scenario(50))
    assert len(vectors) == 3
    sent = upstream.fake.received[-1].body["input"]
    assert sent[0] == "short question"  # short texts go as they are
    assert document.startswith(sent[1]) and 40 <= tokenizer.count(sent[1]) <= 50  # the start, cut to fit
    assert tokenizer.count(sent[2]) <= 50 and texts[2].startswith(sent[2])


def test_api_embedder_without_a_tokenizer_cuts_by_bytes() -> None:
    text = "ab✓" * 10  # 5 bytes per repeat
    cut = _fit(text, 12, _utf8_bytes)
    assert text.startswith(cut) and 8 <= len(cut.encode()) <= 12
    assert _fit("short", 12, _utf8_bytes) == "short"
