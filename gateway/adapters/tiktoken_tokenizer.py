"""Tokenizer adapter over tiktoken, loaded offline from the BPE files litellm ships.

tiktoken downloads its BPE files on first use. litellm's wheel carries `o200k_base` and `cl100k_base`
(sha256-checked by tiktoken), so `TIKTOKEN_CACHE_DIR` is pointed there while the encodings load, and the
loaded `Encoding` objects are kept, so nothing later depends on that variable.

Encoding per model: tiktoken's own model table (gpt-4o, gpt-4.1, gpt-5, o-series -> o200k_base; gpt-4,
gpt-3.5 -> cl100k_base). Fallback, documented in docs/front-doors.md: models tiktoken does not know (Claude,
Llama, Gemini...) and the old p50k/r50k models are counted with o200k_base, an estimate.
"""

from __future__ import annotations

import importlib.util
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import orjson
import tiktoken
from tiktoken.model import encoding_name_for_model

from gateway.errors import ConfigError

FALLBACK_ENCODING = "o200k_base"
AVAILABLE = ("o200k_base", "cl100k_base")
# OpenAI's accounting for chat messages: a few tokens of framing per message and for the reply.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REPLY = 3
# A rough, fixed cost for an image part (OpenAI's low-detail price); exact costs depend on resolution.
TOKENS_PER_IMAGE = 85

_load_lock = threading.Lock()


def bundled_bpe_dir() -> Path:
    spec = importlib.util.find_spec("litellm")  # finds the package without importing it (~3 s)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("litellm is not installed; its bundled tiktoken files are needed offline")
    return Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"


def load_encoding(name: str) -> tiktoken.Encoding:
    with _load_lock:
        previous = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = str(bundled_bpe_dir())
        try:
            encoding = tiktoken.get_encoding(name)
        finally:
            if previous is None:
                del os.environ["TIKTOKEN_CACHE_DIR"]
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = previous
        _drop_python_ranks(encoding)
        return encoding


def _drop_python_ranks(encoding: tiktoken.Encoding) -> None:
    """Free the Python copy of the encoding's vocabulary (bytes -> rank, 200k entries for o200k_base:
    ~27 MB resident; BENCHMARKS.md, issue 29). Encoding and decoding run on the Rust core, which holds its
    own copy; the dict only serves pickling an encoding tiktoken's registry does not know (registered ones
    pickle by name) and tiktoken's educational module, neither used here. A tiktoken without the
    attribute keeps everything."""
    if "_mergeable_ranks" in vars(encoding):
        del encoding._mergeable_ranks


def encoding_name(model: str) -> str:
    bare = model.rsplit("/", 1)[-1]
    try:
        name = encoding_name_for_model(bare)
    except KeyError:
        return FALLBACK_ENCODING
    return name if name in AVAILABLE else FALLBACK_ENCODING


# A long text is counted line by line, and the lines' counts are kept: the same lines recur request after
# request (system prompts, pasted documents, the old messages retrieval shows again). This is exact: a line
# break followed by a letter, a digit or one of `[#…<` always ends a chunk of the encodings' pre-tokenizer
# (for o200k_base and cl100k_base no chunk pattern runs on past a newline into those characters; "/" and
# whitespace may follow a newline inside a chunk, so no split is made before them), and BPE never merges
# across chunks. tests/test_tokenizer.py checks the sums against whole counts on generated texts.
_LINE_BREAK = re.compile(r"\n(?=[^\W_]|[\[#…<])")
_SPLIT_MIN_CHARS = 256  # shorter texts are counted whole
_CACHE_MIN_CHARS = 48  # shorter lines are counted again: cheaper than keeping them
_CACHE_CHARS = 8_000_000  # the cached lines' total length, least recently used dropped first
_MAX_MODEL_NAMES = 1024
_ENTRY_BYTES = 160  # a cached line's string header and its ordered-dict entry, besides its characters


class TiktokenTokenizer:
    """Counts tokens of text and of chat messages for one encoding."""

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self._encoding = encoding
        self._cache: OrderedDict[str, int] = OrderedDict()  # line -> tokens
        self._cached_chars = 0
        # A long history is counted on a worker thread while the event loop counts other requests' lines.
        self._cache_lock = threading.Lock()

    def cached_bytes(self) -> int:
        """What the line cache holds: its characters (a byte each in ASCII text) and each entry's cost."""
        return self._cached_chars + len(self._cache) * _ENTRY_BYTES

    @classmethod
    def for_model(cls, model: str) -> TiktokenTokenizer:
        return cls(load_encoding(encoding_name(model)))

    @property
    def name(self) -> str:
        return self._encoding.name

    def count(self, text: str) -> int:
        if len(text) < _SPLIT_MIN_CHARS:
            return len(self._encoding.encode_ordinary(text))
        total = start = 0
        for match in _LINE_BREAK.finditer(text):
            total += self._line(text[start : match.end()])
            start = match.end()
        return total + self._line(text[start:])

    def count_concat(self, parts: Sequence[tuple[str, int | None]]) -> int:
        # Exact by the same cut: a part's text between its first and last line breaks that end a chunk
        # stays one run of whole chunks when joined, so its share is its count less its first and last
        # lines; what lies between one part's last cut and the next part's first is counted whole.
        total = 0
        pending = ""  # the text since the last cut, not counted yet
        for text, tokens in parts:
            cuts = [match.end() for match in _LINE_BREAK.finditer(text)]
            if tokens is None or not cuts:
                pending += text
                continue
            head, tail = text[: cuts[0]], text[cuts[-1] :]
            total += self.count(pending + head) + tokens - self.count(head) - self.count(tail)
            pending = tail
        return total + self.count(pending)

    def _line(self, line: str) -> int:
        if len(line) < _CACHE_MIN_CHARS:
            return len(self._encoding.encode_ordinary(line))
        with self._cache_lock:
            cached = self._cache.get(line)
            if cached is not None:
                self._cache.move_to_end(line)
                return cached
        count = len(self._encoding.encode_ordinary(line))
        if len(line) <= _CACHE_CHARS // 8:  # one huge line never flushes the rest
            with self._cache_lock:
                if line not in self._cache:
                    self._cached_chars += len(line)
                self._cache[line] = count
                while self._cached_chars > _CACHE_CHARS:
                    dropped, _ = self._cache.popitem(last=False)
                    self._cached_chars -= len(dropped)
        return count

    def count_message(self, message: object) -> int:
        if not isinstance(message, dict):
            return TOKENS_PER_MESSAGE
        total = TOKENS_PER_MESSAGE
        for key, value in message.items():
            if key == "content":
                total += self._content(value)
            elif key in ("role", "name", "tool_call_id") and isinstance(value, str):
                total += self.count(value)
            elif key in ("tool_calls", "function_call") and value is not None:
                total += self._structured(value)
        return total

    def count_messages(self, messages: Sequence[object]) -> int:
        return sum(self.count_message(m) for m in messages) + TOKENS_PER_REPLY

    def _content(self, value: object) -> int:
        if isinstance(value, str):
            return self.count(value)
        if isinstance(value, list):
            total = 0
            for part in value:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += self.count(str(part["text"]))
                elif isinstance(part, dict) and part.get("type") in ("image_url", "input_image"):
                    total += TOKENS_PER_IMAGE
                else:
                    total += self._structured(part)
            return total
        return 0

    def _structured(self, value: object) -> int:
        return self.count(orjson.dumps(value).decode())


class TiktokenTokenizers:
    """One tokenizer per encoding, loaded once and shared by every model that uses it."""

    def __init__(self) -> None:
        self._by_encoding: dict[str, TiktokenTokenizer] = {}
        self._by_model: dict[str, TiktokenTokenizer] = {}

    def cache_bytes(self) -> dict[str, int]:
        return {"token_counts": sum(t.cached_bytes() for t in self._by_encoding.values())}

    def for_model(self, model: str) -> TiktokenTokenizer:
        tokenizer = self._by_model.get(model)
        if tokenizer is None:
            name = encoding_name(model)
            tokenizer = self._by_encoding.get(name)
            if tokenizer is None:
                tokenizer = self._by_encoding[name] = TiktokenTokenizer(load_encoding(name))
            if len(self._by_model) >= _MAX_MODEL_NAMES:
                self._by_model.clear()  # model names come from clients: keep the map bounded
            self._by_model[model] = tokenizer
        return tokenizer
