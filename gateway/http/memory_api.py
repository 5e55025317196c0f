"""REST API over a user's long-term memory, scoped to the caller's tenant.

The user is named by the path (`/api/users/{user_id}/memories...`) or, under `/api/memories`, by the
`X-User-Id` header (or `?user_id=`).

GET    .../memories                 list; ?type=&scope=&tag=&status=&since=&until=&q=&limit=&offset=
POST   .../memories                 create one ({"content", "type", "scope", "tags", "event_time", ...})
DELETE /api/users/{user_id}/memories  delete every memory of the user (rows, vectors, source links)
GET    .../memories/search?q=       the memories recall would find for `q` (&project= adds a project)
GET    .../memories/export          every memory of the user, any status, with sources and history
POST   .../memories/import          {"memories": [...]} as exported (or as created): added as new
GET    .../profile                  the user's profile: generated, edited (their own version), shown
PUT    .../profile                  {"content": "..."}: the user's own version; null: back to generated
POST   .../profile/refresh          rewrite the generated profile now (202, a job)
GET    /api/memories/{id}           one memory with its sources and history
PATCH  /api/memories/{id}           edit content, type, scope, tags, event_time or status
DELETE /api/memories/{id}           delete it for good
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import InvalidRequest, NotFound
from gateway.features import learns
from gateway.http.api import MAX_LIMIT, _int_param, _json
from gateway.memory.records import (
    MEMORY_STATUSES,
    MEMORY_TYPES,
    USER_SCOPE,
    Memory,
    MemoryDraft,
    MemoryFilter,
    Profile,
)
from gateway.memory.service import MemoryService
from gateway.pipeline.identify import bounded_id, header_text
from gateway.pipeline.validate import parse_json_object
from gateway.records import profile_job
from gateway.services import Deps
from gateway.tenants import Caller, Tenant

MAX_IMPORT = 5_000
MAX_PROFILE_CHARS = 8_000
M = TypeVar("M", bound=BaseModel)
MemoryType = Literal["preference", "profile", "project", "constraint", "stable_fact", "event"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class MemoryIn(_Body):
    content: str = Field(min_length=1)
    type: MemoryType = "stable_fact"
    scope: str = Field(default=USER_SCOPE, min_length=1, max_length=200)
    tags: list[str] = Field(default_factory=list, max_length=20)
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    event_time: datetime | None = None  # a date alone is midnight UTC


class ImportedMemory(MemoryIn):
    """An exported memory read back: its date (`event_at`, as export writes it) and status are kept;
    the other fields export adds are ignored (new ids are given; history and sources stay with the
    original)."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)
    event_at: datetime | None = None
    status: Literal["active", "superseded"] = "active"


class MemoryPatch(_Body):
    content: str | None = Field(default=None, min_length=1)
    type: MemoryType | None = None
    scope: str | None = Field(default=None, min_length=1, max_length=200)
    tags: list[str] | None = Field(default=None, max_length=20)
    event_time: datetime | None = None  # a date alone is midnight UTC
    status: Literal["active", "superseded"] | None = None


class ProfileIn(_Body):
    content: str | None = Field(max_length=MAX_PROFILE_CHARS)


class ImportBody(_Body):
    memories: list[ImportedMemory] = Field(max_length=MAX_IMPORT)


def _parsed(model: type[M], raw: bytes) -> M:
    data = parse_json_object(raw or b"{}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or None
        raise InvalidRequest(f"{field or 'body'}: {error['msg']}", param=field) from exc


def _when(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _service(request: Request) -> tuple[MemoryService, str]:
    deps: Deps = request.state.deps
    caller: Caller = request.scope["caller"]
    service = deps.memory_service(caller.tenant.name)
    if service is None:
        raise NotFound("Memory is not enabled for this key's tenant (memory.enabled in its config).")
    return service, caller.tenant.name


def _user(request: Request) -> str:
    user = (
        request.path_params.get("user_id")
        or header_text(request.headers.get("x-user-id", "").strip())
        or request.query_params.get("user_id")
    )
    if not user:
        raise InvalidRequest(
            "Name the user: /api/users/{user_id}/memories, an X-User-Id header or ?user_id=.",
            param="user_id",
        )
    return str(bounded_id(str(user)))  # as chat requests store it (a long id becomes its digest)


def _max_chars(request: Request) -> int:
    caller: Caller = request.scope["caller"]
    return caller.tenant.config.memory.max_memory_chars


def _check_content(content: str | None, limit: int, field: str = "content") -> None:
    if content is not None and len(content) > limit:
        raise InvalidRequest(f"{field}: longer than the {limit} characters a memory may hold", param=field)


def _draft(item: MemoryIn) -> MemoryDraft:
    tags = tuple(dict.fromkeys(t.strip().lower() for t in item.tags if t.strip()))
    when = item.event_time
    status = "active"
    if isinstance(item, ImportedMemory):
        when = when or item.event_at
        status = item.status
    return MemoryDraft(item.content, item.type, item.scope, tags, item.confidence, _when(when), status)


def _out(memory: Memory) -> dict[str, object]:
    return {**asdict(memory), "object": "memory"}


def _choice(request: Request, name: str, allowed: tuple[str, ...]) -> tuple[str, ...] | None:
    values = tuple(v for raw in request.query_params.getlist(name) for v in raw.split(",") if v)
    bad = [v for v in values if v not in allowed]
    if bad:
        raise InvalidRequest(f"{name}: {bad[0]!r} is not one of {', '.join(allowed)}", param=name)
    return values or None


def _scopes(request: Request) -> tuple[str, ...] | None:
    """`?scope=user&scope=atlas` or `?scope=user,atlas`."""
    values = tuple(
        v.strip() for raw in request.query_params.getlist("scope") for v in raw.split(",") if v.strip()
    )
    return values or None


def _date_param(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise InvalidRequest(f"{name}: not an ISO date or time: {raw!r}", param=name) from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


async def list_memories(request: Request) -> Response:
    service, tenant = _service(request)
    statuses = _choice(request, "status", (*MEMORY_STATUSES, "any"))
    where = MemoryFilter(
        _user(request),
        scopes=_scopes(request),
        types=_choice(request, "type", MEMORY_TYPES),
        tag=request.query_params.get("tag"),
        statuses=None if statuses and "any" in statuses else statuses or ("active",),
        since=_date_param(request, "since"),
        until=_date_param(request, "until"),
        text=request.query_params.get("q"),
        limit=_int_param(request, "limit", 100, MAX_LIMIT),
        offset=_int_param(request, "offset", 0, 10**9),
    )
    items = await service.store.find(tenant, where)
    return _json({"object": "list", "data": [_out(m) for m in items]})


async def create_memory(request: Request) -> Response:
    service, tenant = _service(request)
    user = _user(request)
    item = _parsed(MemoryIn, await request.body())
    _check_content(item.content, _max_chars(request))
    (memory,) = await service.create(tenant, user, [_draft(item)])
    if memory.scope == USER_SCOPE:
        await _profile_changed(request, tenant, user, stale=False)
    response = _json(_out(memory))
    response.status_code = 201
    return response


async def delete_user_memories(request: Request) -> Response:
    service, tenant = _service(request)
    user = _user(request)
    removed = await service.delete_user(tenant, user)  # the profile goes with them
    return _json({"object": "memories.deleted", "user_id": user, "deleted": len(removed)})


async def search_memories(request: Request) -> Response:
    service, tenant = _service(request)
    user = _user(request)
    text = request.query_params.get("q", "").strip()
    if not text:
        raise InvalidRequest("q: give the text to search for", param="q")
    project = request.query_params.get("project")
    scopes = (USER_SCOPE, project) if project else (USER_SCOPE,)
    found = await service.search(tenant, user, scopes, text, _int_param(request, "limit", 10, 100))
    return _json({"object": "list", "data": [{**_out(m), "score": round(score, 5)} for m, score in found]})


async def export_memories(request: Request) -> Response:
    service, tenant = _service(request)
    return _json(await service.export(tenant, _user(request)))


async def import_memories(request: Request) -> Response:
    service, tenant = _service(request)
    user = _user(request)
    body = _parsed(ImportBody, await request.body())
    limit = _max_chars(request)
    for number, item in enumerate(body.memories):
        _check_content(item.content, limit, f"memories.{number}.content")
    drafts = [_draft(m) for m in body.memories]
    made = await service.create(tenant, user, drafts, skip_known=True)
    if any(m.scope == USER_SCOPE for m in made):
        await _profile_changed(request, tenant, user, stale=False)
    response = _json(
        {
            "object": "memories.imported",
            "user_id": user,
            "imported": len(made),
            "known": len(drafts) - len(made),
        }
    )
    response.status_code = 201
    return response


async def _memory(request: Request) -> tuple[MemoryService, Memory]:
    """The memory named in the path, in the caller's tenant; when the request names a user
    (`X-User-Id`, `?user_id=`), only one of theirs."""
    service, tenant = _service(request)
    memory = await service.store.get(tenant, request.path_params["id"])
    named = header_text(request.headers.get("x-user-id", "").strip()) or request.query_params.get("user_id")
    if memory is not None and named and memory.user_id != bounded_id(named):
        memory = None
    if memory is None:
        raise NotFound(f"No memory {request.path_params['id']!r} for this key.")
    return service, memory


async def get_memory(request: Request) -> Response:
    _, memory = await _memory(request)
    return _json(_out(memory))


async def edit_memory(request: Request) -> Response:
    raw = await request.body()
    patch = _parsed(MemoryPatch, raw)
    _check_content(patch.content, _max_chars(request))
    service, memory = await _memory(request)
    given = patch.model_dump(exclude_unset=True)
    fields: dict[str, object] = {}
    for name in ("content", "type", "scope", "status"):
        if given.get(name) is not None:
            fields[name] = given[name]
    if patch.tags is not None:
        fields["tags"] = tuple(dict.fromkeys(t.strip().lower() for t in patch.tags if t.strip()))
    if "event_time" in given:
        fields["event_at"] = _when(patch.event_time)
    if fields.get("status") == "active":
        fields["superseded_by"] = None
    edited = await service.edit(memory, **fields)
    if USER_SCOPE in (memory.scope, edited.scope):
        await _profile_changed(request, memory.tenant, memory.user_id, stale=True)
    return _json(_out(edited))


async def delete_memory(request: Request) -> Response:
    service, memory = await _memory(request)
    await service.delete(memory.tenant, [memory.id])
    if memory.scope == USER_SCOPE:
        await _profile_changed(request, memory.tenant, memory.user_id, stale=True)
    return _json({"object": "memory.deleted", "id": memory.id, "deleted": True})


def _profile_out(tenant: str, user: str, profile: Profile | None) -> dict[str, object]:
    if profile is None:
        profile = Profile(tenant, user, None, None, 0, None, None)
    fields = {k: v for k, v in asdict(profile).items() if k != "covered"}  # internal bookkeeping
    return {"object": "memory.profile", **fields, "shown": profile.shown}


async def get_profile(request: Request) -> Response:
    service, tenant = _service(request)
    user = _user(request)
    return _json(_profile_out(tenant, user, await service.store.profile(tenant, user)))


async def put_profile(request: Request) -> Response:
    service, tenant = _service(request)
    user = _user(request)
    body = _parsed(ProfileIn, await request.body())
    profile = await service.store.edit_profile(tenant, user, body.content or None)
    return _json(_profile_out(tenant, user, profile))


async def _profile_changed(request: Request, tenant: str, user: str, *, stale: bool) -> None:
    caller: Caller = request.scope["caller"]
    await profile_changed(request.state.deps, caller.tenant, user, stale=stale)


async def profile_changed(deps: Deps, tenant: Tenant, user: str, *, stale: bool) -> None:
    """After the user's own change to their memories: the generated profile may no longer hold
    (`stale`: shown no more until rewritten), and a rewrite is queued where the tenant writes profiles."""
    service = deps.memory_service(tenant.name)
    if service is None or not tenant.config.memory.profile:
        return
    if stale:
        await service.store.save_profile(tenant.name, user, generated=None)
    if learns(tenant.config):
        await deps.jobs.enqueue(profile_job(tenant.name, user, None))
        deps.workers.notify()


async def refresh_profile(request: Request) -> Response:
    deps: Deps = request.state.deps
    caller: Caller = request.scope["caller"]
    _, tenant = _service(request)
    user = _user(request)
    if not learns(caller.tenant.config):
        raise InvalidRequest(
            "This tenant writes no profiles: memory.profile and memory.extraction must be on, with a key of "
            "the gateway's own (not upstream.pass_through_client_key).",
            param="memory.profile",
        )
    job_id = await deps.jobs.enqueue(profile_job(tenant, user, None))
    deps.workers.notify()
    response = _json({"object": "job", "id": job_id, "queued": job_id is not None})
    response.status_code = 202
    return response


def memory_routes() -> list[Route]:
    routes: list[Route] = []
    for base in ("/api/memories", "/api/users/{user_id}/memories"):
        routes += [
            Route(base, list_memories, methods=["GET"]),
            Route(base, create_memory, methods=["POST"]),
            Route(f"{base}/search", search_memories, methods=["GET"]),
            Route(f"{base}/export", export_memories, methods=["GET"]),
            Route(f"{base}/import", import_memories, methods=["POST"]),
        ]
    for base in ("/api/profile", "/api/users/{user_id}/profile"):
        routes += [
            Route(base, get_profile, methods=["GET"]),
            Route(base, put_profile, methods=["PUT"]),
            Route(f"{base}/refresh", refresh_profile, methods=["POST"]),
        ]
    return [
        *routes,
        Route("/api/users/{user_id}/memories", delete_user_memories, methods=["DELETE"]),
        Route("/api/memories/{id}", get_memory, methods=["GET"]),
        Route("/api/memories/{id}", edit_memory, methods=["PATCH"]),
        Route("/api/memories/{id}", delete_memory, methods=["DELETE"]),
    ]
