"""Anthropic Messages request -> the pipeline's chat form (OpenAI chat-completion body).

The chat form is what the store keeps and the builder rebuilds, so the mapping is deterministic (the same
Anthropic history always gives the same chat messages: recognition depends on it) and keeps what the chat
form cannot say in the fields litellm also uses for it: `thinking_blocks` on assistant messages (thinking
and redacted_thinking blocks, verbatim, signatures included) and `cache_control` on content parts
(`chat_form.plain_chat` drops them before a request goes to an OpenAI-compatible upstream).

Every check names the field the way Anthropic's own 400s do (`messages.2.content.0.type: ...`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from gateway.errors import InvalidRequest
from gateway.ports import JSON, JSONObject

# Top-level fields that have a chat equivalent (mapped below); any other field is dropped and reported.
_MAPPED = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "stream",
        "temperature",
        "top_p",
        "stop_sequences",
        "metadata",
        "tools",
        "tool_choice",
        "output_config",
    }
)
_EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


@dataclass(frozen=True, slots=True)
class Converted:
    """The chat body, and the client's fields it has no place for (reported in a response header)."""

    body: JSONObject
    dropped: tuple[str, ...]


def _fail(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


def _text_of(block: JSONObject, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _fail(f"{where}.text", "Input should be a valid string")
    return text


def _text_part(block: JSONObject, where: str) -> JSONObject:
    part: JSONObject = {"type": "text", "text": _text_of(block, where)}
    if isinstance(block.get("cache_control"), dict):
        part["cache_control"] = block["cache_control"]
    return part


def _image_part(block: JSONObject, where: str) -> JSONObject:
    source = block.get("source")
    if not isinstance(source, dict):
        raise _fail(f"{where}.source", "Field required")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise _fail(f"{where}.source", "base64 images need 'media_type' and 'data' strings")
        url = f"data:{media};base64,{data}"
    elif kind == "url" and isinstance(source.get("url"), str):
        url = str(source["url"])
    else:
        raise _fail(f"{where}.source.type", f"image sources are 'base64' or 'url'; got {kind!r}")
    part: JSONObject = {"type": "image_url", "image_url": {"url": url}}
    if isinstance(block.get("cache_control"), dict):
        part["cache_control"] = block["cache_control"]
    return part


def _document_part(block: JSONObject, where: str) -> JSONObject:
    source = block.get("source")
    if not isinstance(source, dict):
        raise _fail(f"{where}.source", "Field required")
    kind = source.get("type")
    if kind == "text" and isinstance(source.get("data"), str):
        return {"type": "text", "text": str(source["data"])}
    if kind == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type") if isinstance(source.get("media_type"), str) else "application/pdf"
        file: JSONObject = {"file_data": f"data:{media};base64,{source['data']}"}
        if isinstance(block.get("title"), str):
            file["filename"] = block["title"]
        return {"type": "file", "file": file}
    raise _fail(f"{where}.source.type", f"document sources are 'base64' or 'text' here; got {kind!r}")


def _user_part(block: JSONObject, where: str) -> JSONObject:
    kind = block.get("type")
    if kind == "text":
        return _text_part(block, where)
    if kind == "image":
        return _image_part(block, where)
    if kind == "document":
        return _document_part(block, where)
    raise _fail(
        f"{where}.type",
        f"unsupported content block type {kind!r} in a user message "
        "(text, image, document and tool_result are accepted)",
    )


def _compact(parts: list[JSON]) -> JSON:
    """One plain text part reads as a string (how most clients send it); anything else stays a list."""
    if len(parts) == 1 and isinstance(parts[0], dict) and parts[0].keys() == {"type", "text"}:
        return parts[0]["text"]
    return parts


def _tool_result(block: JSONObject, where: str) -> tuple[JSONObject, list[JSON]]:
    """The tool message, and any images of the result (a tool message cannot carry them)."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _fail(f"{where}.tool_use_id", "Field required")
    content = block.get("content")
    texts: list[JSON] = []
    images: list[JSON] = []
    if isinstance(content, str):
        texts.append({"type": "text", "text": content})
    elif isinstance(content, list):
        for index, item in enumerate(content):
            spot = f"{where}.content.{index}"
            if not isinstance(item, dict):
                raise _fail(spot, "Input should be an object")
            if item.get("type") == "image":
                images.append(_image_part(item, spot))
            elif item.get("type") == "text":
                texts.append(_text_part(item, spot))
            else:
                raise _fail(
                    f"{spot}.type", f"tool results hold text and image blocks; got {item.get('type')!r}"
                )
    elif content is not None:
        raise _fail(f"{where}.content", "Input should be a string or a list of blocks")
    message: JSONObject = {
        "role": "tool",
        "tool_call_id": call_id,
        "content": _compact(texts) if texts else "",
    }
    if block.get("is_error") is True:
        message["is_error"] = True
    return message, images


def _user(content: JSON, where: str) -> list[JSONObject]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list) or not content:
        raise _fail(f"{where}.content", "Input should be a string or a non-empty list of blocks")
    tools: list[JSONObject] = []
    parts: list[JSON] = []
    for index, block in enumerate(content):
        spot = f"{where}.content.{index}"
        if not isinstance(block, dict):
            raise _fail(spot, "Input should be an object")
        if block.get("type") == "tool_result":
            message, images = _tool_result(block, spot)
            tools.append(message)
            parts.extend(images)
        else:
            parts.append(_user_part(block, spot))
    if parts:
        tools.append({"role": "user", "content": _compact(parts)})
    return tools


def _assistant(content: JSON, where: str) -> JSONObject:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise _fail(f"{where}.content", "Input should be a string or a list of blocks")
    texts: list[JSON] = []
    calls: list[JSON] = []
    thinking: list[JSON] = []
    compaction: list[JSON] = []
    for index, block in enumerate(content):
        spot = f"{where}.content.{index}"
        if not isinstance(block, dict):
            raise _fail(spot, "Input should be an object")
        kind = block.get("type")
        if kind == "compaction":
            content_of = block.get("content")
            if content_of is not None and not isinstance(content_of, str):
                raise _fail(f"{spot}.content", "Input should be a string or null")
            compaction.append(block)  # the provider's own summary: sent back verbatim
        elif kind == "text":
            texts.append(_text_part(block, spot))
        elif kind == "tool_use":
            name, call_id = block.get("name"), block.get("id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise _fail(spot, "tool_use blocks need 'id' and 'name' strings")
            arguments = block.get("input", {})
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(block)
        else:
            raise _fail(
                f"{spot}.type",
                f"unsupported content block type {kind!r} in an assistant message "
                "(text, tool_use, thinking, redacted_thinking and compaction are accepted)",
            )
    message: JSONObject = {"role": "assistant", "content": _compact(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["thinking_blocks"] = thinking
    if compaction:
        message["compaction_blocks"] = compaction
    return message


def _system(system: JSON) -> JSONObject | None:
    if system is None or system == "" or system == []:
        return None
    if isinstance(system, str):
        return {"role": "system", "content": system}
    if not isinstance(system, list):
        raise _fail("system", "Input should be a string or a list of text blocks")
    parts: list[JSON] = []
    for index, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _fail(f"system.{index}.type", "system blocks must be text blocks")
        parts.append(_text_part(block, f"system.{index}"))
    return {"role": "system", "content": _compact(parts)}


def _tools(tools: JSON) -> tuple[list[JSON], list[str]]:
    """The client tools as chat function tools, and the server tools left out (named for the header):
    web search, code execution and the like run at Anthropic, which a chat upstream cannot do."""
    if not isinstance(tools, list):
        raise _fail("tools", "Input should be a list")
    out: list[JSON] = []
    left_out: list[str] = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _fail(f"tools.{index}", "Input should be an object")
        name = tool.get("name")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            left_out.append(f"tools.{index}({kind})")
            continue
        if not isinstance(name, str) or not name:
            raise _fail(f"tools.{index}.name", "Field required")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise _fail(f"tools.{index}.input_schema", "Field required")
        function: JSONObject = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out, left_out


def _tool_choice(choice: JSON, body: JSONObject) -> None:
    if not isinstance(choice, dict):
        raise _fail("tool_choice", "Input should be an object")
    kind = choice.get("type")
    if kind == "auto":
        body["tool_choice"] = "auto"
    elif kind == "any":
        body["tool_choice"] = "required"
    elif kind == "none":
        body["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise _fail("tool_choice.type", f"expected 'auto', 'any', 'tool' (with name) or 'none'; got {kind!r}")
    if choice.get("disable_parallel_tool_use") is True:
        body["parallel_tool_calls"] = False


def _output_config(config: JSON, body: JSONObject) -> None:
    """Structured output and effort: chat's `response_format` (json_schema) and `reasoning_effort`."""
    if not isinstance(config, dict):
        raise _fail("output_config", "Input should be an object")
    form = config.get("format")
    if isinstance(form, dict):
        schema = form.get("schema")
        if form.get("type") != "json_schema" or not isinstance(schema, dict):
            raise _fail("output_config.format", "expected {'type': 'json_schema', 'schema': {...}}")
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema, "strict": True},
        }
    effort = config.get("effort")
    if isinstance(effort, str):
        if effort not in _EFFORT:
            raise _fail("output_config.effort", f"expected one of {', '.join(_EFFORT)}; got {effort!r}")
        body["reasoning_effort"] = _EFFORT[effort]


# Claude Code before its JSON form: `user_<device>_account_<account uuid or nothing>_session_<uuid>`.
_CLAUDE_CODE_USER = re.compile(
    r"user_(?P<device>[0-9a-f]+)_account_(?P<account>[0-9a-f-]*)_session_[0-9a-f-]+"
)


def end_user(user_id: str) -> str | None:
    """The gateway's user for Anthropic's `metadata.user_id`. Claude Code sends its account, device and
    session there (a JSON object, or one string in older versions): the user is the account, else the
    device, never the session (each run of the CLI has a new one); None when only a session is named.
    Any other id is the user as sent."""
    if user_id.startswith("{"):
        try:
            parsed = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return user_id
        if not isinstance(parsed, dict) or not parsed.keys() & {"device_id", "account_uuid", "session_id"}:
            return user_id
        parts = {k: v for k, v in parsed.items() if isinstance(v, str)}
    elif (match := _CLAUDE_CODE_USER.fullmatch(user_id)) is not None:
        parts = {"account_uuid": match["account"], "device_id": match["device"]}
    else:
        return user_id
    return parts.get("account_uuid") or parts.get("device_id") or None


def to_chat(body: JSONObject, *, count_only: bool = False) -> Converted:
    """The chat-completion body for an Anthropic Messages request; `InvalidRequest` names a bad field.
    `count_only`: a `count_tokens` body, which has no `max_tokens`."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("model", "Field required")
    max_tokens = body.get("max_tokens")
    if max_tokens is None and not count_only:
        raise _fail("max_tokens", "Field required")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise _fail("max_tokens", "Input should be a positive integer")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("messages", "Field required (a non-empty list)")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _fail("stream", "Input should be a valid boolean")

    chat: list[JSON] = []
    system = _system(body.get("system"))
    if system is not None:
        chat.append(system)
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if not isinstance(message, dict):
            raise _fail(where, "Input should be an object")
        role = message.get("role")
        if role == "user":
            chat.extend(_user(message.get("content"), where))
        elif role == "assistant":
            chat.append(_assistant(message.get("content"), where))
        else:
            raise _fail(f"{where}.role", f"Input should be 'user' or 'assistant'; got {role!r}")

    out: JSONObject = {"model": model, "messages": chat}
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    if stream is not None:
        out["stream"] = stream
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = body[key]
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _fail("stop_sequences", "Input should be a list of strings")
        if stop:
            out["stop"] = stop
    metadata = body.get("metadata")
    sent_user = metadata.get("user_id") if isinstance(metadata, dict) else None
    if isinstance(sent_user, str) and sent_user:
        user = end_user(sent_user)
        if user is not None:
            out["user"] = user  # Anthropic's end-user id is the gateway's user: memory follows
    left_out: list[str] = []
    if body.get("tools") is not None:
        tools, left_out = _tools(body["tools"])
        if tools:
            out["tools"] = tools
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], out)
    if body.get("output_config") is not None:
        _output_config(body["output_config"], out)
    dropped = tuple(sorted(key for key in body if key not in _MAPPED and body[key] is not None)) + tuple(
        left_out
    )
    return Converted(out, dropped)
