"""`conversation_search`: the model searches the user's past conversations (Claude-style), next to
`memory_search`, through the same tool loop. The gateway answers it from the retrieval index (keyword
and vector rankings fused, like the retrieval section), with each hit's date, its conversation, and the
message before it; the current conversation is left out (the model has it)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gateway.errors import EmbeddingError, StoreError
from gateway.memory.arguments import parse_arguments, search_parameters
from gateway.pipeline.call import ChatCall
from gateway.ports import Embedder, JSONObject, MessageStore, VectorIndex
from gateway.records import SearchQuery, SearchResult
from gateway.text import message_text

log = logging.getLogger(__name__)

CONVERSATION_TOOL_NAME = "conversation_search"
HITS = 5
SNIPPET_CHARS = 400
_RRF_K = 30

CONVERSATION_TOOL: JSONObject = {
    "type": "function",
    "function": {
        "name": CONVERSATION_TOOL_NAME,
        "description": (
            "Search the user's earlier conversations (not this one) for what was said there: decisions, "
            "names, numbers, plans. Use it when the user refers to a past chat."
        ),
        "parameters": search_parameters("messages"),
    },
}


def _fused(result: SearchResult) -> list[str]:
    """Node ids, best first, by reciprocal-rank fusion of both rankings (every view adds)."""
    scores: dict[str, float] = {}
    for hits in (result.semantic, result.keyword):
        for rank, hit in enumerate(hits):
            scores[hit.node_id] = scores.get(hit.node_id, 0.0) + 1.0 / (_RRF_K + rank)
    return sorted(scores, key=lambda node: scores[node], reverse=True)


@dataclass(slots=True)
class ConversationSearch:
    index: VectorIndex
    embedder: Embedder | None  # None: keyword search only
    store: MessageStore

    async def __call__(self, call: ChatCall, arguments: str) -> str:
        """The tool's answer: the best messages of the user's other conversations, or why there are none."""
        args = parse_arguments(arguments)
        if isinstance(args, str):
            return args
        query, since, until = args
        user = call.state.user_id
        if user is None:
            return "error: past conversations are searched per user, and this request names none"
        try:
            vector = await self.embedder.embed_query(query) if self.embedder is not None else None
        except EmbeddingError:
            vector = None  # keyword search alone
        search = SearchQuery(
            tenant=call.tenant,
            text=query,
            vector=vector,
            limit=HITS * 6,
            user_id=user,
            exclude_conversation_id=call.state.conversation_id,
            since=since,
            until=until,
        )
        try:
            found = await self.index.search(search)
            lines: list[str] = []
            for node_id in _fused(found)[:HITS]:
                path = await self.store.path(call.tenant, node_id, newest_messages=2)
                if not path or path[-1].node.conversation_id == call.state.conversation_id:
                    continue
                hit = path[-1]
                when = "date unknown" if hit.meta.get("undated") else f"{hit.created_at:%Y-%m-%d}"
                lines.append(f"[{when}, conversation {hit.node.conversation_id}]")
                for message in path:
                    text = " ".join(message_text(message.data).split())
                    lines.append(f"{message.node.role}: {text[:SNIPPET_CHARS]}")
        except StoreError as exc:  # the model is told, and answers without it
            log.warning("conversation_search failed: %s", exc)
            return "error: past conversations are unavailable right now"
        return "\n".join(lines) or "nothing found"
