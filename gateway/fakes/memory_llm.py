"""Deterministic answers to the gateway's memory calls, for the fake upstream (tests, benchmarks, demo).

Extraction is an extractive stand-in for a real model: every sentence of a user turn that says something
about the speaker ("I", "my", "we", "our", ...) becomes a memory holding that sentence, sourced to its
turn. Resolution: a candidate that says the fact changed ("now", "moved to", "switched", "no longer")
supersedes the closest existing memory; one whose words hold an existing memory's, or are held by
them, is a NOOP;
anything else is added. A profile lists every memory it was given. Good enough to test the pipeline around the model, and said to be a stand-in
wherever its figures are reported.
"""

from __future__ import annotations

import re
from html import unescape

import orjson

from gateway.memory.prompts import EXTRACT_MARKER, PROFILE_MARKER, RESOLVE_MARKER, TITLE_MARKER
from gateway.ports import JSONObject

_TURN = re.compile(r'<turn n="(\d+)"[^>]*>\n(.*?)\n</turn>', re.DOTALL)
_CANDIDATE = re.compile(r'<candidate n="(\d+)">(.*?)</candidate>((?:\n  <existing [^>]*>.*?</existing>)*)')
_EXISTING = re.compile(r"<existing [^>]*>(.*?)</existing>")
_SENTENCE = re.compile(
    "[^.!?\n\u3002\uff01\uff1f]+[.!?\u3002\uff01\uff1f]?"
)  # also the CJK full stop, ! and ?
_SELF = re.compile(
    r"\b(i|i'm|i've|i'd|my|me|mine|we|we're|our|us)\b|我|我们|저는|제가|나는|우리", re.IGNORECASE
)
_PREFERENCE = re.compile(r"\b(prefer|like|love|hate|enjoy|always|never|favou?rite|vegetarian|vegan)\b", re.I)
_CHANGE = re.compile(r"\b(now|moved to|switched|no longer|changed|instead)\b|改成|换成|现在", re.IGNORECASE)
_WORD = re.compile(r"[^\W_]+")


def memory_answer(body: JSONObject) -> str | None:
    """The answer to a memory call, or None when `body` is not one."""
    messages = body.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        return None
    system, user = messages[0], messages[1]
    if not isinstance(system, dict) or not isinstance(user, dict):
        return None
    instruction, text = str(system.get("content") or ""), str(user.get("content") or "")
    if instruction.startswith(EXTRACT_MARKER):
        return orjson.dumps({"memories": extract(text)}).decode()
    if instruction.startswith(RESOLVE_MARKER):
        return orjson.dumps({"decisions": resolve(text)}).decode()
    if instruction.startswith(PROFILE_MARKER):
        return profile(text)
    if instruction.startswith(TITLE_MARKER):
        return title(text)
    return None


def is_memory_call(body: JSONObject) -> bool:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return False
    markers = (EXTRACT_MARKER, RESOLVE_MARKER, PROFILE_MARKER, TITLE_MARKER)
    return str(messages[0].get("content") or "").startswith(markers)


def title(transcript: str) -> str:
    """A title from the first user line's first six words, a gist from the last user line's first ten."""
    said = [line.removeprefix("user: ") for line in transcript.splitlines() if line.startswith("user: ")]
    if not said:
        return ""
    first, last = said[0].split(), said[-1].split()
    return f"Title: {' '.join(first[:6])}\nGist: Latest: {' '.join(last[:10])}"


def extract(transcript: str) -> list[JSONObject]:
    out: list[JSONObject] = []
    for number, turn in _TURN.findall(transcript):
        for sentence in _SENTENCE.findall(turn):
            sentence = sentence.strip()
            if len(sentence) < 8 or sentence.endswith(("?", "\uff1f")) or not _SELF.search(sentence):
                continue
            out.append(
                {
                    "content": unescape(sentence),
                    "type": "preference" if _PREFERENCE.search(sentence) else "stable_fact",
                    "tags": [],
                    "confidence": 0.8,
                    "event_time": None,
                    "source": int(number),
                }
            )
    return out


def profile(text: str) -> str:
    """Every memory it was given, as one bullet list, newest last."""
    items = [line.split(") ", 1)[-1] for line in text.splitlines() if line.startswith("- [")]
    return "## Standing preferences\n" + "\n".join(f"- {item}" for item in items)


def resolve(text: str) -> list[JSONObject]:
    decisions: list[JSONObject] = []
    for number, candidate, block in _CANDIDATE.findall(text):
        existing = _EXISTING.findall(block)
        words = {w.lower() for w in _WORD.findall(candidate)}
        action, target = "ADD", None
        if existing and _CHANGE.search(candidate):
            action, target = "SUPERSEDE", 1
        else:
            for index, memory in enumerate(existing, start=1):
                held = {w.lower() for w in _WORD.findall(memory)}
                if words <= held or held <= words:
                    action, target = "NOOP", index
                    break
        decisions.append({"candidate": int(number), "action": action, "target": target, "content": None})
    return decisions
