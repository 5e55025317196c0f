"""Prompts of the summarisation calls; each opens with a marker so logs (and the fake upstream) can tell
them apart from user traffic."""

from __future__ import annotations

from datetime import datetime

from gateway.ports import JSONObject
from gateway.text import message_text

CHUNK_MARKER = "[context-gateway:summarize-chunk]"
MERGE_MARKER = "[context-gateway:merge-summaries]"
CONDENSE_MARKER = "[context-gateway:condense-summaries]"

TASK_STATE = """Write the result as structured task state, in these sections (leave a section out when empty):
## Goal
## Confirmed facts
## Decisions
## Constraints
## Failed attempts
## Open questions
## Next steps
## Key identifiers
Key identifiers are kept verbatim: file names, paths, function names, numbers, versions, dates, names,
error codes, URLs. Write what the user said and decided, not how the conversation went. Be terse."""

CHUNK_SYSTEM = f"""{CHUNK_MARKER}
You compress a stretch of a conversation between a user and an assistant into task state, so that the
conversation can go on without the original messages. {TASK_STATE}"""

MERGE_SYSTEM = f"""{MERGE_MARKER}
You merge the task state of a conversation so far with the task state of its newest stretch into one
updated task state. Newer information wins when the two disagree; drop what is no longer true, keep every
still-relevant key identifier verbatim. Stay under {{limit}} tokens. {TASK_STATE}"""


CONDENSE_SYSTEM = f"""{CONDENSE_MARKER}
You rebuild the task state of a conversation from the summaries of its consecutive stretches, oldest
first. Later stretches win when they disagree; drop what is no longer true, keep every still-relevant key
identifier verbatim. Stay under {{limit}} tokens. {TASK_STATE}"""


def render_message(depth: int, message: JSONObject, created_at: datetime | None) -> str:
    """One message as a line block the summariser reads: `[#depth role date] text`."""
    role = str(message.get("role"))
    when = f" {created_at:%Y-%m-%d %H:%M}" if created_at is not None else ""
    return f"[#{depth} {role}{when}] " + message_text(message)


def chunk_request(model: str, rendered: list[str]) -> JSONObject:
    return {
        "model": model,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": CHUNK_SYSTEM},
            {"role": "user", "content": "\n\n".join(rendered)},
        ],
    }


def merge_request(model: str, earlier: str, newer: str, limit: int) -> JSONObject:
    return {
        "model": model,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": MERGE_SYSTEM.replace("{limit}", str(limit))},
            {
                "role": "user",
                "content": f"<earlier_state>\n{earlier}\n</earlier_state>\n\n<newest_stretch>\n{newer}\n</newest_stretch>",
            },
        ],
    }


def condense_request(model: str, parts: list[str], limit: int) -> JSONObject:
    body = "\n\n".join(f"<stretch n={n}>\n{part}\n</stretch>" for n, part in enumerate(parts, start=1))
    return {
        "model": model,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": CONDENSE_SYSTEM.replace("{limit}", str(limit))},
            {"role": "user", "content": body},
        ],
    }
