"""Per conversation, when its previous turn was answered and what the client's own prefix was (model,
system prompt, tools): tells a provider cache that expired from one the client changed.

In-process and bounded: a replica knows the turns it answered; a conversation it has not seen, or one
forgotten for room, gets no verdict.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from gateway.ports import JSON, JSONObject

# Providers keep a cached prefix about five minutes after its last use (Anthropic's default TTL; OpenAI
# 5-10 minutes): a turn later than this finds it gone.
CACHE_TTL_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class PreviousTurn:
    seconds_ago: float
    prefix_changed: bool  # model, system prompt or tools differ from the previous turn's


def client_prefix(body: JSONObject) -> bytes:
    """A digest of what the client's requests share before any history: model, leading system
    messages and tools, in the client's order."""
    messages = body.get("messages")
    system: list[JSON] = []
    for message in messages if isinstance(messages, list) else []:
        if not (isinstance(message, dict) and message.get("role") in ("system", "developer")):
            break
        system.append(message.get("content"))
    form = (body.get("model"), system, body.get("tools"))
    return hashlib.blake2b(orjson.dumps(form, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()


@dataclass(slots=True)
class PrefixLedger:
    size: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _seen: OrderedDict[str, tuple[float, bytes]] = field(default_factory=OrderedDict, init=False)

    def turn(self, conversation_id: str, prefix: bytes) -> PreviousTurn | None:
        """Note this turn; what the previous one of this conversation was, if this process saw it."""
        now = self.clock()
        previous = self._seen.pop(conversation_id, None)
        self._seen[conversation_id] = (now, prefix)
        if len(self._seen) > self.size:
            self._seen.popitem(last=False)
        if previous is None:
            return None
        return PreviousTurn(now - previous[0], previous[1] != prefix)
