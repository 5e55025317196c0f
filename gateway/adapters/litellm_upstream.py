"""Upstream adapter for non-OpenAI providers (Anthropic, Gemini, Bedrock...): litellm translates both ways.

The pipeline hands over an OpenAI request and gets OpenAI wire bytes back (one JSON object, or SSE chunk
frames ending in `[DONE]`), so nothing past this module can tell it from the byte pass-through in
`aiohttp_upstream`. litellm is imported when the first such tenant is built (it costs seconds) and is kept
offline: it fetches no price list, beta-header table or tokenizer on its own.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import re
from collections.abc import AsyncIterator, Mapping
from types import ModuleType
from typing import Any

import httpx
import orjson

from gateway.adapters.httpx_errors import translate_error
from gateway.adapters.litellm_wire import completion, frame
from gateway.config import UpstreamConfig
from gateway.errors import NotSupported, UpstreamError, UpstreamTimeout, UpstreamUnreachable
from gateway.ports import JSON, ChatPayload, Headers, JSONObject, UpstreamResponse

log = logging.getLogger(__name__)

# litellm reads these at import or on first use; without them it downloads catalogues from GitHub.
_OFFLINE_ENVIRONMENT = (
    ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),  # the price list, fetched at import
    (
        "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS",
        "True",
    ),  # the beta-header table, fetched on first Anthropic call
    ("LITELLM_OFFLINE_MODE", "true"),  # everything else it would fetch unasked (tokenizers, blog feed)
)

# The OpenAI chat-completion body fields. Only these become litellm keyword arguments: litellm reads its
# own controls from the same keywords (api_base, api_key, mock_response, metadata...), so an unknown body
# field must never reach it, or a client could send the tenant's key to a host of its choosing.
_OPENAI_FIELDS = frozenset(
    {
        "messages",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
# litellm handles these for every provider even where its supported-parameter list omits them.
_ALWAYS_PASSED = frozenset({"messages", "stream", "stream_options"})
# Sampling and bookkeeping hints: dropping one the provider lacks cannot change the answer's shape, while
# passing it makes litellm refuse the whole request (UnsupportedParamsError), which no OpenAI client expects.
_DROPPABLE_HINTS = frozenset(
    {
        "frequency_penalty",
        "logit_bias",
        "parallel_tool_calls",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "safety_identifier",
        "seed",
        "service_tier",
        "store",
        "user",
        "verbosity",
    }
)
# Values that ask for nothing beyond the default, so an unsupported field carrying one is dropped too.
_NEUTRAL_VALUES: Mapping[str, JSON] = {"n": 1, "logprobs": False, "top_logprobs": 0}
# OpenAI's `metadata` tags stored completions; litellm would take it as its own logging metadata.
_ALWAYS_DROPPED = frozenset({"metadata"})

# Providers whose litellm translation moves every system message, wherever it stands, into the one system
# prompt before all messages.
_HOISTS_SYSTEM = frozenset({"anthropic"})
_SYSTEM_ROLES = ("system", "developer")

_DONE = b"data: [DONE]\n\n"
_MAX_CAUSE_DEPTH = 16
_LITELLM_NOISE = re.compile(r"litellm\.\w+: |\.? Handle with `litellm\.\w+`\.?")


def load_litellm() -> ModuleType:
    """Import litellm offline and quiet.

    `import_module` rather than `import litellm` keeps mypy from analysing litellm's ~2,000 modules (40 s
    per cold run) for nothing: its `acompletion` is typed `Any` anyway.
    """
    for name, value in _OFFLINE_ENVIRONMENT:
        os.environ.setdefault(name, value)
    module = importlib.import_module("litellm")
    litellm: Any = module
    # Otherwise it prints "Provider List" banners and "Give Feedback" hints to stdout on every miss.
    litellm.suppress_debug_info = True
    return module


@functools.lru_cache(maxsize=256)
def _supported_params(litellm: ModuleType, model: str, provider: str) -> frozenset[str] | None:
    # ~0.6 ms a lookup; the model name comes from clients, hence the bounded cache.
    params = litellm.get_supported_openai_params(model=model, custom_llm_provider=provider)
    return frozenset(params) if params is not None else None


class LiteLLMUpstream:
    """Sends chat completions to `config.provider` through litellm and answers in OpenAI's wire format."""

    def __init__(self, name: str, config: UpstreamConfig) -> None:
        self.name = name
        self._config = config
        self._provider = config.provider
        self._where = f"{config.provider} at {config.base_url or 'its default URL'}"
        self._litellm = load_litellm()
        # Every litellm exception class (all derive from the openai SDK's); anything else is a bug to surface.
        self._errors: tuple[type[Exception], ...] = tuple(self._litellm.exceptions.LITELLM_EXCEPTION_TYPES)
        self._timeout = httpx.Timeout(config.timeout_seconds, connect=config.connect_timeout_seconds)

    async def chat_completions(
        self, payload: ChatPayload, headers: Headers, client_key: str | None
    ) -> UpstreamResponse:
        # Client headers are not forwarded: they were meant for an OpenAI API, and litellm writes the
        # provider's own (x-api-key, anthropic-version...).
        api_key = client_key if self._config.pass_through_client_key else self._config.api_key
        if self._config.pass_through_client_key and not api_key:
            # litellm would fall back to the server's own ANTHROPIC_API_KEY (etc.) from the environment.
            return _error_response(
                401,
                "No provider API key was sent for this pass-through tenant.",
                "authentication_error",
                "missing_api_key",
            )
        arguments, dropped = self._arguments(payload.data)
        arguments["api_key"] = api_key
        extra: Headers = [("x-gateway-dropped-params", ",".join(dropped))] if dropped else []
        try:
            result = await self._litellm.acompletion(**arguments)
        except self._errors as exc:
            return self._failed(exc)
        if arguments.get("stream") is True:
            return await self._stream(result, extra)
        body = orjson.dumps(completion(result.model_dump()))
        return UpstreamResponse(200, [("content-type", "application/json"), *extra], _once(body), _nothing)

    async def forward(
        self,
        method: str,
        path: str,
        query: str,
        headers: Headers,
        body: AsyncIterator[bytes] | bytes,
        client_key: str | None,
    ) -> UpstreamResponse:
        if method == "GET" and path.rstrip("/") == "/models":
            models = [
                {"id": model, "object": "model", "created": 0, "owned_by": self._provider}
                for model in self._config.models
            ]
            body_out = orjson.dumps({"object": "list", "data": models})
            return UpstreamResponse(200, [("content-type", "application/json")], _once(body_out), _nothing)
        raise NotSupported(
            f"{method} /v1{path} is not available for tenant {self.name!r}: its {self._provider} upstream "
            "is reached through litellm, which serves only /v1/chat/completions and GET /v1/models."
        )

    async def aclose(self) -> None:
        # Nothing to release: litellm's HTTP clients are process-wide and shared by every such tenant.
        return None

    def _arguments(self, data: JSONObject) -> tuple[dict[str, Any], list[str]]:
        """litellm keyword arguments for `data`, and the body fields left out (see the field sets above)."""
        model = str(data.get("model"))
        prefix = f"{self._provider}/"
        bare = model.removeprefix(prefix)
        supported = _supported_params(self._litellm, bare, self._provider)
        arguments: dict[str, Any] = {
            "model": model if model.startswith(prefix) else prefix + model,
            "timeout": self._timeout,
        }
        if self._config.base_url is not None:
            arguments["api_base"] = self._config.base_url
        dropped: list[str] = []
        for key, value in data.items():
            if key == "model" or value is None:
                continue  # null means "the default" in OpenAI's API
            if key == "messages" and self._provider in _HOISTS_SYSTEM and isinstance(value, list):
                value = system_in_place(value)
            if _left_out(key, value, supported):
                dropped.append(key)
            else:
                arguments[key] = value
        if dropped:
            log.debug("tenant %s: not sent to %s: %s", self.name, self._provider, ", ".join(dropped))
        return arguments, dropped

    async def _stream(self, stream: Any, extra: Headers) -> UpstreamResponse:
        # Wait for the first chunk so a provider that refuses the request lazily still gets its status and
        # error body through, instead of a 200 with an in-band error frame.
        chunks: AsyncIterator[Any] = stream.__aiter__()
        started = False
        try:
            first = await anext(chunks, None)
            started = True
        except self._errors as exc:
            return self._failed(exc)
        finally:
            if not started:  # refused, failed or cancelled: nobody will call close() on this one
                await stream.aclose()
        return UpstreamResponse(
            200,
            [("content-type", "text/event-stream"), ("cache-control", "no-cache"), *extra],
            self._frames(chunks, first),
            stream.aclose,
        )

    async def _frames(self, chunks: AsyncIterator[Any], first: Any) -> AsyncIterator[bytes]:
        if first is None:
            return  # no chunk and no [DONE]: the relay reports the truncated stream
        try:
            yield frame(first)
            async for chunk in chunks:
                yield frame(chunk)
        except self._errors as exc:
            raise self._mid_stream(exc) from exc
        yield _DONE

    def _failed(self, exc: Exception) -> UpstreamResponse:
        """A provider's refusal becomes its status and an OpenAI error body; a failed transport raises."""
        failure = self._transport_failure(exc)
        if failure is not None:
            raise failure from exc
        status = getattr(exc, "provider_status_code", None) or getattr(exc, "status_code", None)
        status = status if isinstance(status, int) and 400 <= status <= 599 else 502
        message, error_type = _provider_error(exc)
        headers = _retry_after(exc)
        return _error_response(
            status, message, error_type or _TYPE_BY_STATUS.get(status, "api_error"), None, headers
        )

    def _mid_stream(self, exc: Exception) -> UpstreamError:
        failure = self._transport_failure(exc)
        if failure is not None:
            return failure
        original = getattr(exc, "original_exception", None)
        message, error_type = _provider_error(original if isinstance(original, Exception) else exc)
        return UpstreamError(f"upstream {self._where} failed mid-stream: {message}", code=error_type)

    def _transport_failure(self, exc: Exception) -> UpstreamError | None:
        # litellm files a refused connection under InternalServerError (status 500, as if the provider had
        # answered 500); the httpx error in the cause chain tells the two apart.
        original = getattr(exc, "original_exception", None)  # MidStreamFallbackError wraps the real one
        cause = original if isinstance(original, Exception) else exc
        transport = _find_cause(cause, httpx.TransportError)
        if transport is not None:
            return translate_error(transport, self._where)
        if isinstance(cause, self._litellm.Timeout):
            return UpstreamTimeout(f"upstream {self._where} timed out: {_message(cause)}")
        if isinstance(cause, self._litellm.APIConnectionError):
            return UpstreamUnreachable(f"upstream {self._where} failed: {_message(cause)}")
        return None


def _text_parts(content: JSON) -> list[JSON]:
    if isinstance(content, list):
        return [p for p in content if isinstance(p, dict) and p.get("type") == "text" and p.get("text")]
    return [{"type": "text", "text": content}] if isinstance(content, str) and content else []


def system_in_place(messages: list[JSON]) -> list[JSON]:
    """`messages` with each system message after the first other one (the gateway's volatile tail) as
    text opening the next user message: litellm would hoist it into the system prompt, ahead of the
    whole conversation, and change the prefix the provider caches on every turn."""
    leading = next(
        (i for i, m in enumerate(messages) if not (isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES)),
        len(messages),
    )
    if not any(isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES for m in messages[leading:]):
        return messages
    out: list[JSON] = list(messages[:leading])
    pending: list[JSON] = []
    for message in messages[leading:]:
        role = message.get("role") if isinstance(message, dict) else None
        if isinstance(message, dict) and role in _SYSTEM_ROLES:
            pending.extend(_text_parts(message.get("content")))
            continue
        if pending and isinstance(message, dict) and role == "user":
            message, pending = _opened(message, pending), []
        elif pending and role == "assistant":
            out.append({"role": "user", "content": pending})  # no user words followed: a turn of its own
            pending = []
        out.append(message)
    if pending:  # last of all: after tool results it ends their turn, else litellm hoists it anyway
        last = out[-1] if out else None
        after_user = isinstance(last, dict) and last.get("role") in ("user", "tool")
        out.append({"role": "user" if after_user else "system", "content": pending})
    return out


def _opened(message: JSONObject, parts: list[JSON]) -> JSONObject:
    """A user message with `parts` before its own content (a message-level mark moved onto its text)."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [*parts, *content]}
    own = _text_parts(content)
    mark = message.get("cache_control")
    if isinstance(mark, dict) and own:
        own = [{"type": "text", "text": content, "cache_control": mark}]
    opened = {k: v for k, v in message.items() if k != "cache_control"}
    opened["content"] = [*parts, *own]
    return opened


def _left_out(key: str, value: JSON, supported: frozenset[str] | None) -> bool:
    if key not in _OPENAI_FIELDS or key in _ALWAYS_DROPPED:
        return True
    if supported is None or key in supported or key in _ALWAYS_PASSED:
        return False
    return key in _DROPPABLE_HINTS or _NEUTRAL_VALUES.get(key, ...) == value


_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def _find_cause(exc: BaseException, kind: type[httpx.TransportError]) -> httpx.TransportError | None:
    seen: BaseException | None = exc
    for _ in range(_MAX_CAUSE_DEPTH):
        if seen is None:
            return None
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _message(exc: Exception) -> str:
    """litellm's message without its own class-name prefixes and "Handle with ..." advice."""
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) else str(exc)
    return _LITELLM_NOISE.sub("", text).strip()


def _provider_error(exc: Exception) -> tuple[str, str | None]:
    """The provider's own message and error type, dug out of litellm's message when it embeds the body.

    litellm only keeps the provider's error body as text inside its message (`... - {"type": "error",
    "error": {...}}`, or its bytes repr for streams); Anthropic, OpenAI-style and Gemini bodies all hold
    an `error` object with a `message`.
    """
    text = _message(exc)
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        try:
            parsed = orjson.loads(text[start : end + 1])
        except orjson.JSONDecodeError:
            parsed = None
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            kind = error.get("type") or error.get("status")
            return error["message"], kind if isinstance(kind, str) else None
    return text, None


def _retry_after(exc: Exception) -> Headers:
    headers = getattr(exc, "litellm_response_headers", None)
    if isinstance(headers, Mapping):
        value = headers.get("retry-after")
        if isinstance(value, str):
            return [("retry-after", value)]
    return []


def _error_response(
    status: int, message: str, error_type: str, code: str | None, headers: Headers | None = None
) -> UpstreamResponse:
    body = orjson.dumps({"error": {"message": message, "type": error_type, "param": None, "code": code}})
    return UpstreamResponse(
        status, [("content-type", "application/json"), *(headers or [])], _once(body), _nothing
    )


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def _nothing() -> None:
    return None
