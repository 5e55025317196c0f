"""Tolerant reading of the memory calls' replies: JSON found inside fences or prose, every item checked,
and what cannot be used dropped (or, when nothing of the reply is usable, reported as junk)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import unescape

import orjson

from gateway.memory.prompts import Candidate, Turn
from gateway.memory.records import MEMORY_TYPES
from gateway.ports import JSON, JSONObject

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")
MAX_TAGS = 10
MAX_TAG_CHARS = 40
ACTIONS = ("ADD", "UPDATE", "SUPERSEDE", "NOOP")


class Junk(ValueError):
    """The reply holds no JSON object of the expected shape."""


def json_object(reply: str, key: str) -> list[JSON]:
    """The list under `key` of the first JSON object in the reply (fenced or bare, prose around it
    allowed); a bare list is taken as that list."""
    texts = [m.group(1) for m in _FENCE.finditer(reply)] + [reply]
    for text in texts:
        for opening, closing in (("{", "}"), ("[", "]")):
            start, end = text.find(opening), text.rfind(closing)
            if start < 0 or end <= start:
                continue
            try:
                value = orjson.loads(text[start : end + 1])
            except orjson.JSONDecodeError:
                continue
            found: object = value.get(key) if isinstance(value, dict) else value
            if isinstance(found, list):
                return found
    raise Junk(f"no JSON object with a {key!r} list in the reply")


def _event_at(value: JSON) -> datetime | None:
    if not isinstance(value, str) or not _DATE.match(value):
        return None
    try:
        return datetime.fromisoformat(value[:10]).replace(tzinfo=UTC)
    except ValueError:
        return None


def _tags(value: JSON) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    tags = [t.strip().lower()[:MAX_TAG_CHARS] for t in value if isinstance(t, str) and t.strip()]
    return tuple(dict.fromkeys(tags))[:MAX_TAGS]


def candidates(reply: str, turns: Sequence[Turn], max_chars: int) -> list[Candidate]:
    """The usable memories of an extraction reply. An item is dropped when its text is empty or too
    long, or when it names no turn of the user's (a fact must come from a user turn)."""
    by_number = {turn.number: turn for turn in turns}
    out: list[Candidate] = []
    for item in json_object(reply, "memories"):
        if not isinstance(item, dict):
            continue
        content, source = item.get("content"), item.get("source")
        if not isinstance(content, str) or not content.strip() or len(content.strip()) > max_chars:
            continue
        if isinstance(source, str) and source.isdigit():
            source = int(source)
        if not isinstance(source, int) or isinstance(source, bool) or source not in by_number:
            continue
        kind = item.get("type")
        confidence = item.get("confidence")
        out.append(
            Candidate(
                content=" ".join(unescape(content).split()),  # the transcript was escaped
                type=kind if isinstance(kind, str) and kind in MEMORY_TYPES else "stable_fact",
                tags=_tags(item.get("tags")),
                confidence=min(max(float(confidence), 0.0), 1.0)
                if isinstance(confidence, int | float) and not isinstance(confidence, bool)
                else 0.7,
                event_at=_event_at(item.get("event_time")),
                turn=by_number[source],
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Decision:
    action: str
    target: int | None = None  # 1-based, among the candidate's existing memories
    content: str | None = None


def decisions(reply: str, count: int, near: Sequence[int], max_chars: int) -> list[Decision]:
    """One decision per candidate (`near[i]`: how many existing memories candidate i was shown). A
    decision that names no shown memory, or an UPDATE without usable text, falls back to ADD: a fact is
    never lost to a malformed answer."""
    chosen: dict[int, Decision] = {}
    for item in json_object(reply, "decisions"):
        if not isinstance(item, dict):
            continue
        number, action, target = item.get("candidate"), item.get("action"), item.get("target")
        if not isinstance(number, int) or not 1 <= number <= count or number in chosen:
            continue
        action = action.upper() if isinstance(action, str) else "ADD"
        valid_target = (
            isinstance(target, int) and not isinstance(target, bool) and 1 <= target <= near[number - 1]
        )
        content = item.get("content")
        text = " ".join(unescape(content).split()) if isinstance(content, str) else ""
        unusable = action not in ACTIONS or (action != "ADD" and not valid_target)
        if unusable or (action == "UPDATE" and not 0 < len(text) <= max_chars):
            chosen[number] = Decision("ADD")
        else:
            chosen[number] = Decision(action, target if valid_target else None, text or None)  # type: ignore[arg-type]
    return [chosen.get(n, Decision("ADD")) for n in range(1, count + 1)]


def reply_text(body: JSONObject) -> str:
    """The first choice's text of a chat completion."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise Junk("no choices in the reply")
    message = choices[0].get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        raise Junk("no text in the reply")
    return content
