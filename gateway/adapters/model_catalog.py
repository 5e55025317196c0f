"""ModelCatalog over the model table litellm ships (context windows), read without importing litellm."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import orjson

_TABLE = "model_prices_and_context_window_backup.json"


def _table_path() -> Path | None:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / _TABLE


class LiteLLMModelCatalog:
    """Input context windows by model name; provider prefixes (`openai/gpt-4o`) are tried bare too."""

    def __init__(self, windows: dict[str, int]) -> None:
        self._windows = windows

    @classmethod
    def load(cls) -> LiteLLMModelCatalog:
        path = _table_path()
        if path is None or not path.exists():
            return cls({})
        table = orjson.loads(path.read_bytes())
        windows: dict[str, int] = {}
        for name, info in table.items():
            if not isinstance(info, dict):
                continue
            value = info.get("max_input_tokens") or info.get("max_tokens")
            if isinstance(value, int) and value > 0:
                windows[name] = value
        return cls(windows)

    def context_window(self, model: str) -> int | None:
        window = self._windows.get(model)
        if window is None and "/" in model:
            window = self._windows.get(model.split("/", 1)[1])
        return window
