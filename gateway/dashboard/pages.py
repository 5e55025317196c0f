"""Dashboard routes: login, overview, conversations, one conversation's tree, one request's context.

Every page is for the signed-in tenant only (a cookie from the login form, or `Authorization: Bearer
KEY` for scripts); an anonymous visitor is sent to the login page and sees no data. The admin key
(`server.admin_key`) sees every tenant, one at a time: a switcher in the header (or `?tenant=NAME` with
the key as a bearer token). Forms that change anything carry a CSRF token tied to the session.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable
from typing import get_args
from urllib.parse import quote, urlencode

import orjson
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from gateway.cache_cost import conversation_cost
from gateway.cache_usage import normalise
from gateway.config import hash_key
from gateway.dashboard.bars import bar
from gateway.dashboard.session import COOKIE, LIFETIME_SECONDS, Sessions
from gateway.dashboard.views import injected_memories, memory_detail, message_tree, preview
from gateway.errors import AuthenticationFailed, InvalidRequest
from gateway.http.api import conversation_filter
from gateway.http.memory_api import MemoryType, profile_changed
from gateway.memory.records import USER_SCOPE, Memory, MemoryFilter
from gateway.memory.service import MemoryService
from gateway.sent import retrieved_groups, sent_messages
from gateway.services import Deps
from gateway.tenants import Tenant

PAGE = 50
MEMORY_TYPES = get_args(MemoryType)

Handler = Callable[[Request, Tenant], Awaitable[Response]]


class Dashboard:
    def __init__(self, secret: str | None, admin_key: str | None = None) -> None:
        self.sessions = Sessions(secret)
        self._admin_digest = hash_key(admin_key) if admin_key else None
        self.templates = Environment(
            loader=PackageLoader("gateway.dashboard", "templates"), autoescape=select_autoescape()
        )

    def render(self, request: Request, name: str, status: int = 200, **context: object) -> HTMLResponse:
        cookie = request.cookies.get(COOKIE)
        csrf = self.sessions.csrf(cookie) if cookie else ""
        deps: Deps = request.state.deps
        # The admin's header lists every tenant to switch to.
        switch = [t.name for t in deps.tenants.tenants] if getattr(request.state, "admin", False) else []
        html = self.templates.get_template(name).render(csrf=csrf, switch=switch, **context)
        response = HTMLResponse(html, status_code=status)
        response.headers["cache-control"] = "no-store"
        return response

    def expired(self, request: Request, tenant: str | None = None) -> HTMLResponse:
        """A changing form whose CSRF token does not check out: refused, nothing done."""
        return self.render(
            request, "error.html", 403, tenant=tenant, message="This form has expired: reload the page."
        )

    def _is_admin(self, key: str) -> bool:
        return self._admin_digest is not None and hmac.compare_digest(hash_key(key), self._admin_digest)

    def _key_tenant(self, deps: Deps, key: str) -> Tenant | None:
        """The tenant a gateway key signs in to, or None."""
        try:
            caller = deps.tenants.resolve(key, None)
        except AuthenticationFailed:
            return None
        return caller.tenant if caller.authenticated else None

    def _tenant(self, request: Request) -> tuple[Tenant, bool] | None:
        """The tenant the caller sees, and whether the caller is the admin."""
        deps: Deps = request.state.deps
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() == "bearer" and key.strip():
            if self._is_admin(key.strip()):
                return _named(deps, request.query_params.get("tenant")), True
            tenant = self._key_tenant(deps, key.strip())
            return (tenant, False) if tenant is not None else None
        session = self.sessions.session(request.cookies.get(COOKIE))
        if session is None or (session.admin and self._admin_digest is None):
            return None  # an admin session outlives no change of config that drops the admin key
        found = next((t for t in deps.tenants.tenants if t.name == session.tenant), None)
        if found is None:
            return (_named(deps, None), True) if session.admin else None
        return found, session.admin

    def page(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            caller = self._tenant(request)
            if caller is None:
                return RedirectResponse("/dashboard/login?" + urlencode({"next": request.url.path}), 303)
            tenant, request.state.admin = caller
            return await handler(request, tenant)

        return endpoint

    # ----------------------------------------------------------------------------------------- login

    async def login_form(self, request: Request) -> Response:
        return self.render(request, "login.html", next=request.query_params.get("next", "/dashboard"))

    async def login(self, request: Request) -> Response:
        deps: Deps = request.state.deps
        form = await request.form()
        key = str(form.get("key", "")).strip()
        target = str(form.get("next", "/dashboard"))
        if not target.startswith("/dashboard"):
            target = "/dashboard"  # never redirect off the dashboard
        admin = bool(key) and self._is_admin(key)
        tenant = _named(deps, None) if admin else self._key_tenant(deps, key) if key else None
        if tenant is None:
            return self.render(
                request, "login.html", 401, next=target, error="That key is not a gateway key."
            )
        return self._signed_in(request, RedirectResponse(target, 303), tenant.name, admin)

    def _signed_in(self, request: Request, response: Response, tenant: str, admin: bool) -> Response:
        response.set_cookie(
            COOKIE,
            self.sessions.issue(tenant, admin=admin),
            max_age=LIFETIME_SECONDS,
            path="/dashboard",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def switch_tenant(self, request: Request, tenant: Tenant) -> Response:
        """The admin turns to another tenant (a new cookie naming it); refused to anyone else."""
        deps: Deps = request.state.deps
        if not request.state.admin or "authorization" in request.headers:
            message = "Only the admin key switches tenants (bearer callers name one with ?tenant=)."
            return self.render(request, "error.html", 403, tenant=tenant.name, message=message)
        if not await self._csrf(request):
            return self.expired(request, tenant.name)
        name = str((await request.form()).get("tenant", ""))
        if not any(t.name == name for t in deps.tenants.tenants):
            return self.render(request, "error.html", 404, tenant=tenant.name, message="No such tenant.")
        return self._signed_in(request, RedirectResponse("/dashboard", 303), name, admin=True)

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        cookie = request.cookies.get(COOKIE)
        if not self.sessions.csrf_ok(cookie, str(form.get("csrf", ""))):
            return self.expired(request)
        response = RedirectResponse("/dashboard/login", 303)
        response.delete_cookie(COOKIE, path="/dashboard")
        return response

    # ----------------------------------------------------------------------------------------- pages

    async def overview(self, request: Request, tenant: Tenant) -> Response:
        deps: Deps = request.state.deps
        requests = await deps.store.list_requests(tenant.name, limit=20)
        jobs = await deps.jobs.counts(tenant.name)
        original = sum(r.original_tokens or 0 for r in requests)
        sent = sum(r.sent_tokens or 0 for r in requests)
        return self.render(
            request,
            "overview.html",
            tenant=tenant.name,
            requests=requests,
            jobs=jobs,
            original=original,
            sent=sent,
            failed=sum(1 for r in requests if r.status != "complete"),
            overhead_ms=deps.metrics.overhead_mean_ms(),
            counters=deps.counters.snapshot(),
        )

    async def conversations(self, request: Request, tenant: Tenant) -> Response:
        deps: Deps = request.state.deps
        params = request.query_params
        user = params.get("user") or None
        raw_page = params.get("page", "1")
        page = max(int(raw_page), 1) if raw_page.isdigit() else 1
        filters = {name: params.get(name, "") for name in ("user", "q", "since", "until")}
        try:
            where = conversation_filter(params)
        except InvalidRequest as exc:
            return self.render(
                request,
                "conversations.html",
                400,
                tenant=tenant.name,
                conversations=[],
                filters=filters,
                error=exc.message,
                page=1,
                more=False,
            )
        found = await deps.store.list_conversations(
            tenant.name,
            limit=PAGE + 1,
            user_id=user,
            offset=(page - 1) * PAGE,
            text=where.text,
            since=where.since,
            until=where.until,
        )
        return self.render(
            request,
            "conversations.html",
            tenant=tenant.name,
            conversations=found[:PAGE],
            filters=filters,
            query=urlencode({k: v for k, v in filters.items() if v}),
            page=page,
            more=len(found) > PAGE,
        )

    async def conversation(self, request: Request, tenant: Tenant) -> Response:
        deps: Deps = request.state.deps
        conversation_id = request.path_params["conversation_id"]
        conversation = await deps.store.get_conversation(tenant.name, conversation_id)
        if conversation is None:
            return self.render(request, "error.html", 404, message="No such conversation for this tenant.")
        messages = await deps.store.conversation_messages(tenant.name, conversation_id)
        leaf = request.query_params.get("leaf") or conversation.last_message_id
        leaves = [m for m in messages if not any(c.node.parent_id == m.node.id for c in messages)]
        # One more than shown: the oldest shown request's replay estimate needs the one before it.
        found = await deps.store.list_requests(tenant.name, conversation_id=conversation_id, limit=PAGE + 1)
        requests = found[:PAGE]
        before = found[PAGE] if len(found) > PAGE else None
        cost = conversation_cost(requests[::-1], tenant.config.pricing, before)
        return self.render(
            request,
            "conversation.html",
            tenant=tenant.name,
            conversation=conversation,
            tree=message_tree(messages, leaf),
            leaves=[(m.node.id, preview(m)) for m in sorted(leaves, key=lambda m: m.created_at)],
            leaf=leaf,
            requests=[(t.record, t.usage) for t in reversed(cost.turns)],
            cost=cost,
            capped=before is not None,
        )

    async def request_detail(self, request: Request, tenant: Tenant) -> Response:
        deps: Deps = request.state.deps
        record = await deps.store.get_request(tenant.name, request.path_params["request_id"])
        if record is None:
            return self.render(request, "error.html", 404, message="No such request for this tenant.")
        report = record.report or {}
        sections = report.get("sections") if isinstance(report.get("sections"), dict) else {}
        path = (
            await deps.store.path(tenant.name, record.parent_message_id)
            if record.parent_message_id and isinstance(report.get("sent"), dict)
            else []
        )
        return self.render(
            request,
            "request.html",
            tenant=tenant.name,
            record=record,
            cache=normalise(record.usage),
            bar=bar(report) if report else None,
            sections=sections,
            sent=sent_messages(report, path, record.sent_context),
            groups=retrieved_groups(report, path),
            memories=await injected_memories(deps, tenant.name, memory_detail(sections)),
            report_json=orjson.dumps(report, option=orjson.OPT_INDENT_2).decode(),
        )

    async def summaries(self, request: Request, tenant: Tenant) -> Response:
        deps: Deps = request.state.deps
        conversation_id = request.path_params["conversation_id"]
        conversation = await deps.store.get_conversation(tenant.name, conversation_id)
        if conversation is None:
            return self.render(
                request,
                "error.html",
                404,
                tenant=tenant.name,
                message="No such conversation for this tenant.",
            )
        rolling = await deps.summaries.summaries(tenant.name, conversation_id, "global")
        chunks = await deps.summaries.summaries(tenant.name, conversation_id, "chunk")
        return self.render(
            request,
            "summaries.html",
            tenant=tenant.name,
            conversation=conversation,
            rolling=rolling,
            chunks=chunks,
        )

    async def jobs(self, request: Request, tenant: Tenant) -> Response:
        deps: Deps = request.state.deps
        return self.render(
            request,
            "jobs.html",
            tenant=tenant.name,
            counts=await deps.jobs.counts(tenant.name),
            failures=await deps.jobs.failures(tenant.name, limit=PAGE),
            notice=request.query_params.get("done", ""),
        )

    async def retry_job(self, request: Request, tenant: Tenant) -> Response:
        deps: Deps = request.state.deps
        if not await self._csrf(request):
            return self.expired(request, tenant.name)
        queued = await deps.jobs.retry(tenant.name, request.path_params["job_id"])
        return RedirectResponse(f"/dashboard/jobs?done={'queued' if queued else 'not-queued'}", 303)

    async def _csrf(self, request: Request) -> bool:
        """A form's token checks out (callers with a bearer key send no cookie, and need none)."""
        if "authorization" in request.headers:
            return True
        form = await request.form()
        return self.sessions.csrf_ok(request.cookies.get(COOKIE), str(form.get("csrf", "")))

    # ----------------------------------------------------------------------------------- memories

    async def memories(self, request: Request, tenant: Tenant) -> Response:
        deps: Deps = request.state.deps
        service = deps.memory_service(tenant.name)
        user = request.query_params.get("user", "").strip() or request.path_params.get("user", "")
        if service is None:
            return self.render(
                request, "error.html", 404, tenant=tenant.name, message="This tenant has no long-term memory."
            )
        kind = request.query_params.get("type") or None
        found = (
            await service.store.find(
                tenant.name, MemoryFilter(user, types=(kind,) if kind else None, limit=500)
            )
            if user
            else []
        )
        profile = await service.store.profile(tenant.name, user) if user else None
        return self.render(
            request,
            "memories.html",
            tenant=tenant.name,
            user=user,
            memories=found,
            kind=kind or "",
            types=MEMORY_TYPES,
            profile=profile.shown if profile is not None else None,
            notice=request.query_params.get("done", ""),
        )

    async def export_memories(self, request: Request, tenant: Tenant) -> Response:
        """The user's memories as the memory API exports them (what import takes back), as a download."""
        deps: Deps = request.state.deps
        service = deps.memory_service(tenant.name)
        if service is None:
            return self.render(
                request, "error.html", 404, tenant=tenant.name, message="This tenant has no long-term memory."
            )
        user = request.path_params["user"]
        document = await service.export(tenant.name, user)
        name = re.sub(r"[^A-Za-z0-9_-]", "_", user)[:60] or "user"
        return Response(
            orjson.dumps(document, option=orjson.OPT_INDENT_2),
            media_type="application/json",
            headers={
                "content-disposition": f'attachment; filename="memories-{name}.json"',
                "cache-control": "no-store",
            },
        )

    async def _changed_memory(
        self, request: Request, tenant: Tenant
    ) -> tuple[MemoryService, Memory] | Response:
        """The memory a form names, once its CSRF token checks out (bearer callers need none)."""
        deps: Deps = request.state.deps
        if not await self._csrf(request):
            return self.expired(request, tenant.name)
        service = deps.memory_service(tenant.name)
        memory = await service.store.get(tenant.name, request.path_params["memory_id"]) if service else None
        if service is None or memory is None:
            return self.render(
                request, "error.html", 404, tenant=tenant.name, message="No such memory for this tenant."
            )
        return service, memory

    async def edit_memory(self, request: Request, tenant: Tenant) -> Response:
        found = await self._changed_memory(request, tenant)
        if isinstance(found, Response):
            return found
        service, memory = found
        content = " ".join(str((await request.form()).get("content", "")).split())
        limit = tenant.config.memory.max_memory_chars
        if not content or len(content) > limit:
            message = f"A memory holds 1 to {limit} characters; nothing was changed."
            return self.render(request, "error.html", 400, tenant=tenant.name, message=message)
        if content != memory.content:
            await service.edit(memory, content=content)
            if memory.scope == USER_SCOPE:
                await profile_changed(request.state.deps, tenant, memory.user_id, stale=True)
        return RedirectResponse(f"/dashboard/users/{quote(memory.user_id)}/memories?done=edited", 303)

    async def delete_memory(self, request: Request, tenant: Tenant) -> Response:
        found = await self._changed_memory(request, tenant)
        if isinstance(found, Response):
            return found
        service, memory = found
        await service.delete(tenant.name, [memory.id])
        if memory.scope == USER_SCOPE:
            await profile_changed(request.state.deps, tenant, memory.user_id, stale=True)
        return RedirectResponse(f"/dashboard/users/{quote(memory.user_id)}/memories?done=deleted", 303)


def _named(deps: Deps, name: str | None) -> Tenant:
    """The tenant called `name`, or the first one (what the admin sees until it switches)."""
    tenants = deps.tenants.tenants
    return next((t for t in tenants if t.name == name), tenants[0])


def dashboard_routes(secret: str | None, admin_key: str | None = None) -> list[BaseRoute]:
    board = Dashboard(secret, admin_key)
    return [
        Route("/dashboard/tenant", board.page(board.switch_tenant), methods=["POST"]),
        Route("/dashboard/login", board.login_form, methods=["GET"]),
        Route("/dashboard/login", board.login, methods=["POST"]),
        Route("/dashboard/logout", board.logout, methods=["POST"]),
        Route("/dashboard", board.page(board.overview), methods=["GET"]),
        Route("/dashboard/conversations", board.page(board.conversations), methods=["GET"]),
        Route("/dashboard/conversations/{conversation_id}", board.page(board.conversation), methods=["GET"]),
        Route("/dashboard/requests/{request_id}", board.page(board.request_detail), methods=["GET"]),
        Route(
            "/dashboard/conversations/{conversation_id}/summaries",
            board.page(board.summaries),
            methods=["GET"],
        ),
        Route("/dashboard/jobs", board.page(board.jobs), methods=["GET"]),
        Route("/dashboard/jobs/{job_id}/retry", board.page(board.retry_job), methods=["POST"]),
        Route("/dashboard/memories", board.page(board.memories), methods=["GET"]),
        Route("/dashboard/users/{user}/memories", board.page(board.memories), methods=["GET"]),
        Route("/dashboard/users/{user}/memories/export", board.page(board.export_memories), methods=["GET"]),
        Route("/dashboard/memories/{memory_id}/edit", board.page(board.edit_memory), methods=["POST"]),
        Route("/dashboard/memories/{memory_id}/delete", board.page(board.delete_memory), methods=["POST"]),
        Mount("/dashboard/static", StaticFiles(packages=[("gateway.dashboard", "static")]), name="static"),
    ]
