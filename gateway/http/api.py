"""REST API over what the gateway stored, scoped to the caller's tenant.

GET /api/conversations                      newest first; ?limit=&offset=&user_id=&q=&since=&until=
                                            (q: a message holds it; since/until: the latest
                                            message's time, a date or an ISO time, until inclusive
                                            for a date)
GET /api/conversations/{id}                 one conversation, with its indexing progress
GET /api/conversations/{id}/messages        the whole tree: every node with its parent and depth
GET /api/conversations/{id}/path/{node_id}  root-to-node path: the history one branch sees
GET /api/conversations/{id}/summaries       rolling summaries (global) and chunk summaries, deepest first
POST /api/conversations/{id}/compact        summarise now what left the recent window (202, a job)
DELETE /api/conversations/{id}              delete it: messages, summaries, records, index rows, vectors
DELETE /api/users/{user_id}                 delete everything of that user: every conversation, the same
                                            way, and every memory (memory_api.py has the memory routes)
GET /api/requests/{id}                      one request: status, usage, ContextReport
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import InvalidRequest, NotFound
from gateway.pipeline.identify import bounded_id
from gateway.pipeline.validate import parse_json_object
from gateway.records import Conversation, StoredMessage, compact_job
from gateway.services import Deps
from gateway.tenants import Caller

MAX_LIMIT = 500


def _json(data: object) -> Response:
    def default(value: object) -> object:
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(type(value).__name__)

    return Response(orjson.dumps(data, default=default), media_type="application/json")


def _int_param(request: Request, name: str, default: int, upper: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) > upper:  # "²" is a digit to isdigit()
        raise InvalidRequest(f"'{name}' must be a whole number from 0 to {upper}.", param=name)
    return int(raw)


@dataclass(frozen=True, slots=True)
class ConversationFilter:
    text: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def conversation_filter(params: Mapping[str, str]) -> ConversationFilter:
    """`q`, `since` and `until` of a conversation listing (the API's and the dashboard's): a bad value
    is refused with the field named. A bare date means the whole day (`until` takes it in)."""

    def moment(name: str, end: bool) -> datetime | None:
        raw = params.get(name, "").strip()
        if not raw:
            return None
        try:
            if len(raw) == 10:
                day = date.fromisoformat(raw)
                start = datetime(day.year, day.month, day.day, tzinfo=UTC)
                if end:  # the whole day; the last one there is runs to the end of time
                    return start + timedelta(days=1) if day < date.max else datetime.max.replace(tzinfo=UTC)
                return start
            value = datetime.fromisoformat(raw)
        except ValueError:
            raise InvalidRequest(
                f"'{name}' must be a date (2026-03-01) or an ISO time (2026-03-01T09:30:00Z).", param=name
            ) from None
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)

    text = params.get("q", "").strip()
    if len(text) > 200:
        raise InvalidRequest("'q' holds at most 200 characters.", param="q")
    return ConversationFilter(text or None, moment("since", False), moment("until", True))


def _message(message: StoredMessage) -> dict[str, object]:
    return {
        **asdict(message.node),
        "message": message.data,
        "created_at": message.created_at,
        "meta": message.meta,
    }


async def _conversation(deps: Deps, caller: Caller, request: Request) -> Conversation:
    """The conversation named in the path, only if it belongs to the caller's tenant."""
    conversation = await deps.store.get_conversation(caller.tenant.name, request.path_params["id"])
    if conversation is None:
        raise NotFound(f"No conversation {request.path_params['id']!r} for this key.")
    return conversation


async def list_conversations(request: Request) -> Response:
    deps: Deps = request.state.deps
    caller: Caller = request.scope["caller"]
    where = conversation_filter(request.query_params)
    items = await deps.store.list_conversations(
        caller.tenant.name,
        limit=_int_param(request, "limit", 50, MAX_LIMIT),
        offset=_int_param(request, "offset", 0, 10**9),
        user_id=bounded_id(request.query_params.get("user_id")),  # as chat requests store it
        text=where.text,
        since=where.since,
        until=where.until,
    )
    return _json({"object": "list", "data": [asdict(c) for c in items]})


async def get_conversation(request: Request) -> Response:
    deps: Deps = request.state.deps
    caller: Caller = request.scope["caller"]
    conversation = await _conversation(deps, caller, request)
    return _json({**asdict(conversation), "index": await deps.index_progress(conversation)})


async def conversation_messages(request: Request) -> Response:
    deps: Deps = request.state.deps
    caller: Caller = request.scope["caller"]
    conversation = await _conversation(deps, caller, request)
    messages = await deps.store.conversation_messages(caller.tenant.name, conversation.id)
    return _json({"object": "list", "data": [_message(m) for m in messages]})


async def conversation_path(request: Request) -> Response:
    deps: Deps = request.state.deps
    caller: Caller = request.scope["caller"]
    path = await deps.store.path(caller.tenant.name, request.path_params["node_id"])
    if not path or path[-1].node.conversation_id != request.path_params["id"]:
        raise NotFound(f"No message {request.path_params['node_id']!r} in this conversation for this key.")
    return _json({"object": "list", "data": [_message(m) for m in path]})


async def conversation_summaries(request: Request) -> Response:
    deps: Deps = request.state.deps
    caller: Caller = request.scope["caller"]
    conversation = await _conversation(deps, caller, request)
    data = {
        level: [asdict(s) for s in await deps.summaries.summaries(caller.tenant.name, conversation.id, level)]
        for level in ("global", "chunk")
    }
    return _json({"object": "summaries", "conversation_id": conversation.id, **data})


async def compact_conversation(request: Request) -> Response:
    deps: Deps = request.state.deps
    caller: Caller = request.scope["caller"]
    conversation = await _conversation(deps, caller, request)
    if conversation.last_message_id is None:
        raise NotFound(f"Conversation {conversation.id!r} has no messages.")
    body = parse_json_object(await request.body() or b"{}")
    model = body.get("model") or caller.tenant.config.compaction.model
    if not isinstance(model, str) or not model:
        raise InvalidRequest(
            "No model for the summarisation calls: set compaction.model for this tenant or send "
            '{"model": "..."} in the body.',
            param="model",
        )
    job_id = await deps.jobs.enqueue(
        compact_job(caller.tenant.name, conversation.id, conversation.last_message_id, model, force=True)
    )
    deps.workers.notify()
    response = _json({"object": "job", "id": job_id, "queued": job_id is not None})
    response.status_code = 202
    return response


async def delete_conversation(request: Request) -> Response:
    deps: Deps = request.state.deps
    caller: Caller = request.scope["caller"]
    conversation = await _conversation(deps, caller, request)
    deleted = await deps.delete_conversations(caller.tenant.name, conversation_id=conversation.id)
    return _json({"object": "conversation.deleted", "id": conversation.id, "deleted": bool(deleted)})


async def delete_user(request: Request) -> Response:
    deps: Deps = request.state.deps
    caller: Caller = request.scope["caller"]
    user_id = str(bounded_id(request.path_params["user_id"]))
    conversations, memories = await deps.delete_user(caller.tenant.name, user_id)
    return _json(
        {
            "object": "user.deleted",
            "user_id": user_id,
            "conversations": conversations,
            "memories": len(memories),
        }
    )


async def get_request(request: Request) -> Response:
    deps: Deps = request.state.deps
    caller: Caller = request.scope["caller"]
    record = await deps.store.get_request(caller.tenant.name, request.path_params["id"])
    if record is None:
        raise NotFound(f"No request {request.path_params['id']!r} for this key.")
    return _json(asdict(record))


def api_routes() -> list[Route]:
    return [
        Route("/api/conversations", list_conversations, methods=["GET"]),
        Route("/api/conversations/{id}", get_conversation, methods=["GET"]),
        Route("/api/conversations/{id}", delete_conversation, methods=["DELETE"]),
        Route("/api/users/{user_id}", delete_user, methods=["DELETE"]),
        Route("/api/conversations/{id}/messages", conversation_messages, methods=["GET"]),
        Route("/api/conversations/{id}/path/{node_id}", conversation_path, methods=["GET"]),
        Route("/api/conversations/{id}/summaries", conversation_summaries, methods=["GET"]),
        Route("/api/conversations/{id}/compact", compact_conversation, methods=["POST"]),
        Route("/api/requests/{id}", get_request, methods=["GET"]),
    ]
