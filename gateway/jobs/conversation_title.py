"""Title job: a conversation's title and one-line gist, for the memory section's digest of the user's
recent conversations (`memory.recent_conversations`).

Queued after a conversation's first exchange and then every `TITLE_EVERY_MESSAGES` messages (one
pending job per conversation). The model reads the opening and the newest messages (the gateway's own
injected blocks taken out) through the tenant's upstream, as the other memory calls do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.jobs.extract_memory import MemoryTarget, clean
from gateway.memory.llm import CallStats, ask
from gateway.memory.prompts import title_request
from gateway.memory.replies import Junk
from gateway.ports import MessageStore
from gateway.records import Job
from gateway.text import message_text

log = logging.getLogger(__name__)

OPENING_MESSAGES = 4
NEWEST_MESSAGES = 6
LINE_CHARS = 300
TITLE_CHARS = 80
GIST_CHARS = 200


def read_title(reply: str) -> tuple[str, str | None]:
    """(title, gist) from the model's two lines; a reply without the labels is read as title, gist."""
    lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
    fields: dict[str, str] = {}
    for line in lines:
        label, _, rest = line.partition(":")
        if label.strip().lower() in ("title", "gist") and rest.strip():
            fields.setdefault(label.strip().lower(), rest.strip())
    title = fields.get("title") or (lines[0] if lines else "")
    gist = fields.get("gist") or (lines[1] if len(lines) > 1 and "title" not in fields else None)
    title = title.strip("\"'*# ")[:TITLE_CHARS]
    if not title:
        raise Junk("no title in the reply")
    return title, gist[:GIST_CHARS] if gist else None


@dataclass(slots=True)
class TitleHandler:
    store: MessageStore
    targets: Callable[[str], MemoryTarget | None]
    stats: CallStats = field(default_factory=CallStats)

    async def __call__(self, job: Job) -> None:
        conversation_id, model = job.payload.get("conversation_id"), job.payload.get("model")
        target = self.targets(job.tenant)
        if not isinstance(conversation_id, str) or target is None or not target.config.recent_conversations:
            return
        conversation = await self.store.get_conversation(job.tenant, conversation_id)
        if conversation is None or conversation.last_message_id is None:
            return  # deleted meanwhile
        path = await self.store.path(job.tenant, conversation.last_message_id)
        shown = (
            path
            if len(path) <= OPENING_MESSAGES + NEWEST_MESSAGES
            else [*path[:OPENING_MESSAGES], *path[-NEWEST_MESSAGES:]]
        )
        lines = []
        for message in shown:
            if message.node.role not in ("user", "assistant"):
                continue
            text = " ".join(clean(message_text(message.data)).split())
            if text:
                lines.append(f"{message.node.role}: {text[:LINE_CHARS]}")
        if not lines:
            return
        name = target.config.model or (model if isinstance(model, str) else "")
        title, gist = await ask(target.upstream, title_request(name, lines), read_title, self.stats)
        if await self.store.set_title(job.tenant, conversation_id, title, gist):
            log.info("conversation %s titled", conversation_id)
