"""NUL characters in stored messages. Providers accept U+0000 in message text (it is valid JSON), but
Postgres's jsonb cannot hold it, so a message carrying one is stored wrapped, with every U+0000 written
as ESC "0" and every ESC doubled (ESC: U+E000, a private-use character); reading unwraps it exactly.
Messages without NUL are stored as they are."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.ports import JSONObject

ESC = "\ue000"
WRAPPER = ESC + "nul"


def pack(data: JSONObject) -> JSONObject:
    if b"\\u0000" not in orjson.dumps(data):
        return data
    return {WRAPPER: _map(data, _escape)}


def unpack(data: Any) -> Any:
    if isinstance(data, dict) and len(data) == 1 and WRAPPER in data:
        return _map(data[WRAPPER], _unescape)
    return data


def escape(text: str) -> str:
    """A text as it is stored inside a packed message (to search the stored JSON for it)."""
    return _escape(text)


def _escape(text: str) -> str:
    return text.replace(ESC, ESC + ESC).replace("\x00", ESC + "0")


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == ESC and i + 1 < len(text):
            out.append("\x00" if text[i + 1] == "0" else text[i + 1])
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _map(value: Any, change: Any) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {change(k): _map(v, change) for k, v in value.items()}
    if isinstance(value, list):
        return [_map(v, change) for v in value]
    return value
