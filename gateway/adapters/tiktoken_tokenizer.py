"""Tokenizer adapter over tiktoken, loaded offline from the BPE files litellm ships.

tiktoken downloads its BPE files on first use. litellm's wheel carries `o200k_base` and `cl100k_base`
(sha256-checked by tiktoken), so `TIKTOKEN_CACHE_DIR` is pointed there while the encodings load, and the
loaded `Encoding` objects are kept, so nothing later depends on that variable.

Encoding per model: tiktoken's own model table (gpt-4o, gpt-4.1, gpt-5, o-series -> o200k_base; gpt-4,
gpt-3.5 -> cl100k_base). Fallback, documented in the README: models tiktoken does not know (Claude,
Llama, Gemini...) and the old p50k/r50k models are counted with o200k_base, an estimate.
"""

from __future__ import annotations

import importlib.util
import os
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
            return tiktoken.get_encoding(name)
        finally:
            if previous is None:
                del os.environ["TIKTOKEN_CACHE_DIR"]
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = previous


def encoding_name(model: str) -> str:
    bare = model.rsplit("/", 1)[-1]
    try:
        name = encoding_name_for_model(bare)
    except KeyError:
        return FALLBACK_ENCODING
    return name if name in AVAILABLE else FALLBACK_ENCODING


_CACHE_MIN_CHARS = 512  # long texts recur on every call (system prompts, pasted documents)
_CACHE_SIZE = 2048
_MAX_MODEL_NAMES = 1024


class TiktokenTokenizer:
    """Counts tokens of text and of chat messages for one encoding."""

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self._encoding = encoding
        self._cache: OrderedDict[str, int] = OrderedDict()

    @classmethod
    def for_model(cls, model: str) -> TiktokenTokenizer:
        return cls(load_encoding(encoding_name(model)))

    @property
    def name(self) -> str:
        return self._encoding.name

    def count(self, text: str) -> int:
        if len(text) < _CACHE_MIN_CHARS:
            return len(self._encoding.encode_ordinary(text))
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            return cached
        count = self._cache[text] = len(self._encoding.encode_ordinary(text))
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
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
