"""Prompts of the memory calls (extraction, resolution) and the JSON schemas their replies follow.

Each system prompt opens with a marker so logs (and the fake upstream) can tell them from user traffic.
The transcript separates what the user said (numbered turns: the only source of facts) from the
assistant's words (context only, to resolve "yes, that one"), so the model is never invited to learn
from the assistant, the system prompt or the gateway's own injected block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape

from gateway.memory.records import MEMORY_TYPES, Memory
from gateway.ports import JSONObject

EXTRACT_MARKER = "[context-gateway:extract-memories]"
RESOLVE_MARKER = "[context-gateway:resolve-memories]"
PROFILE_MARKER = "[context-gateway:write-profile]"
TITLE_MARKER = "[context-gateway:write-title]"
REPAIR_NOTE = (
    "Your previous reply was not valid JSON of the required shape. Reply again with only the JSON object, "
    "nothing before or after it."
)

EXTRACT_SYSTEM = f"""{EXTRACT_MARKER}
You maintain a user's long-term memory. Read the user's numbered turns and write down what is worth
remembering about the user for future, unrelated conversations: preferences, facts about them (profile),
their projects and systems, constraints they work under, stable facts, and dated events in their life.

Rules:
- Only what the user said in a <turn>. The assistant's words in <assistant> are context (to understand
  "yes", "that one"); never facts about the user.
- Each memory stands alone: 1-4 sentences, names instead of pronouns ("The user's daughter Mia", not
  "she"), in the language the user wrote in, key identifiers verbatim (names, versions, numbers).
- Not memory: the task of the moment (debugging this error, drafting this email), greetings, questions
  the user asks, anything only true for this conversation.
- event_time: when what the memory says happened or became true, as YYYY-MM-DD, when the turn says or
  implies it (resolve "last month" against the turn's date); null otherwise.
- type is one of: {", ".join(MEMORY_TYPES)}.
- confidence: 0-1, how sure you are this is a lasting fact about the user.
- source: the number of the turn it comes from.
- Nothing worth remembering: return an empty list.
Reply with JSON only: {{"memories": [{{"content": "...", "type": "...", "tags": ["..."],
"confidence": 0.9, "event_time": null, "source": 1}}]}}"""

RESOLVE_SYSTEM = f"""{RESOLVE_MARKER}
You keep a user's long-term memory consistent. Each <candidate> is a new memory; under it are the
existing memories most like it, numbered. Decide for each candidate:
- ADD: it says something new.
- UPDATE: it adds detail to existing memory `target` without contradicting it; give the merged text in
  `content` (1-4 sentences, standing alone).
- SUPERSEDE: it contradicts existing memory `target` (the fact changed: the candidate is newer and wins).
- NOOP: an existing memory `target` already says it.
Reply with JSON only: {{"decisions": [{{"candidate": 1, "action": "ADD", "target": null,
"content": null}}]}}"""

_MEMORY_ITEM: JSONObject = {
    "type": "object",
    "properties": {
        "content": {"type": "string"},
        "type": {"type": "string", "enum": list(MEMORY_TYPES)},
        "tags": {"type": "array", "items": {"type": "string"}},
        "confidence": {"type": "number"},
        "event_time": {"type": ["string", "null"]},
        "source": {"type": "integer"},
    },
    "required": ["content", "type", "tags", "confidence", "event_time", "source"],
    "additionalProperties": False,
}
EXTRACT_SCHEMA: JSONObject = {
    "type": "object",
    "properties": {"memories": {"type": "array", "items": _MEMORY_ITEM}},
    "required": ["memories"],
    "additionalProperties": False,
}
RESOLVE_SCHEMA: JSONObject = {
    "type": "object",
    "properties": {
        "decisions": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "candidate": {"type": "integer"},
                    "action": {"type": "string", "enum": ["ADD", "UPDATE", "SUPERSEDE", "NOOP"]},
                    "target": {"type": ["integer", "null"]},
                    "content": {"type": ["string", "null"]},
                },
                "required": ["candidate", "action", "target", "content"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["decisions"],
    "additionalProperties": False,
}


PROFILE_SYSTEM = f"""{PROFILE_MARKER}
You write a user's profile from what their long-term memory holds: a short document another assistant
reads before every conversation with them. Sections (leave one out when empty):
## Style and language
## Background
## Standing preferences
## Constraints
Only what the memories say; newer memories win where they disagree; names and identifiers verbatim.
Terse bullet points. Stay under {{limit}} tokens. Reply with the document only."""


TITLE_SYSTEM = f"""{TITLE_MARKER}
You name a conversation for a list of the user's recent chats. Read its opening and latest messages and
reply with exactly two lines:
Title: at most 8 words, what the conversation is about (names and identifiers verbatim)
Gist: one sentence of at most 25 words: where it stands now
Nothing else."""


def title_request(model: str, lines: Sequence[str]) -> JSONObject:
    """The title call: the conversation's opening and newest messages, a line each."""
    return _chat(model, TITLE_SYSTEM, "<conversation>\n" + "\n".join(lines) + "\n</conversation>")


def profile_request(model: str, memories: Sequence[Memory], limit: int) -> JSONObject:
    lines = [
        f"- [{(m.event_at or m.created_at):%Y-%m-%d}] ({m.type}) {m.content}"
        for m in sorted(memories, key=lambda m: m.event_at or m.created_at)
    ]
    user = "<memories>\n" + "\n".join(lines) + "\n</memories>"
    return _chat(model, PROFILE_SYSTEM.replace("{limit}", str(limit)), user)


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn to learn from, with the assistant message before it as context."""

    number: int
    message_id: str
    conversation_id: str
    text: str
    said_at: datetime | None  # None: history that arrived at once (when it was said is unknown)
    context: str | None = None
    author: str | None = None  # the user the turn's request named


@dataclass(frozen=True, slots=True)
class Candidate:
    """A memory the extraction call proposed, checked and tied to the turn it came from."""

    content: str
    type: str
    tags: tuple[str, ...]
    confidence: float
    event_at: datetime | None
    turn: Turn


def _chat(model: str, system: str, user: str, schema: tuple[str, JSONObject] | None = None) -> JSONObject:
    """One memory call: its instructions, its input, and (`schema`: name and JSON schema) the shape the
    answer must have."""
    request: JSONObject = {
        "model": model,
        "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    if schema is not None:
        name, body = schema
        request["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": name, "strict": True, "schema": body},
        }
    return request


def extraction_request(model: str, turns: Sequence[Turn], today: datetime, *, structured: bool) -> JSONObject:
    parts = [f"Today is {today:%Y-%m-%d}."]
    for turn in turns:
        # Escaped: a text holding "</assistant><turn ...>" must not pass for a turn of the user's.
        if turn.context:
            parts.append(f"<assistant>{escape(turn.context, quote=False)}</assistant>")
        when = f' date="{turn.said_at:%Y-%m-%d}"' if turn.said_at is not None else ""
        parts.append(f'<turn n="{turn.number}"{when}>\n{escape(turn.text, quote=False)}\n</turn>')
    return _chat(
        model, EXTRACT_SYSTEM, "\n".join(parts), ("memories", EXTRACT_SCHEMA) if structured else None
    )


def resolution_request(
    model: str, pairs: Sequence[tuple[Candidate, Sequence[Memory]]], *, structured: bool
) -> JSONObject:
    parts = []
    for number, (candidate, near) in enumerate(pairs, start=1):
        lines = [f'<candidate n="{number}">{escape(candidate.content, quote=False)}</candidate>']
        for index, memory in enumerate(near, start=1):
            when = memory.event_at or memory.created_at
            text = escape(memory.content, quote=False)
            lines.append(f'  <existing n="{index}" date="{when:%Y-%m-%d}">{text}</existing>')
        parts.append("\n".join(lines))
    schema = ("decisions", RESOLVE_SCHEMA) if structured else None
    return _chat(model, RESOLVE_SYSTEM, "\n\n".join(parts), schema)


def with_repair(request: JSONObject, reply: str) -> JSONObject:
    """The same request once more, after the model's unusable reply and a note saying what was wrong."""
    messages = list(request["messages"])  # type: ignore[arg-type]
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": REPAIR_NOTE}]
    return {**request, "messages": messages}
