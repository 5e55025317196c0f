"""Every error the gateway itself produces, in OpenAI's shape: {"error": {message, type, param, code}}."""

from __future__ import annotations

import logging

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import GatewayError

log = logging.getLogger(__name__)

_STATUS_CODES = {404: "not_found", 405: "method_not_allowed"}


def error_body(message: str, error_type: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}})


async def handle_gateway_error(request: Request, exc: Exception) -> Response:
    """The request-id middleware puts `x-gateway-request-id` on this answer, as on every other."""
    assert isinstance(exc, GatewayError)
    if exc.status >= 500:
        log.warning("request %s: %s", request.scope.get("request_id"), exc.message)
    body = error_body(exc.message, exc.error_type, exc.param, exc.code)
    return Response(body, status_code=exc.status, media_type="application/json")


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _STATUS_CODES.get(exc.status_code)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    body = error_body(message, "invalid_request_error", None, code)
    return Response(body, status_code=exc.status_code, media_type="application/json", headers=exc.headers)
