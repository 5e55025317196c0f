"""OpenAI Responses request -> the pipeline's chat form (OpenAI chat-completion body).

`input` items become chat messages deterministically, so a client that resends its items (instead of
chaining with `previous_response_id`) is recognised like any chat client: an assistant `message` and
the `function_call` items after it are one assistant message with tool calls, a
`function_call_output` a tool message. `reasoning` items are kept on the message that follows them
(`response_items`, dropped before a chat upstream), so nothing the client sent is lost in the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import InvalidRequest
from gateway.ports import JSON, JSONObject

_MAPPED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "store",
        "stream",
        "max_output_tokens",
        "temperature",
        "top_p",
        "parallel_tool_calls",
        "tools",
        "tool_choice",
        "text",
        "reasoning",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "service_tier",
        "metadata",  # echoed in the response, not sent upstream
        "stream_options",
    }
)
_PASSED = (
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
)
_ROLES = frozenset({"user", "assistant", "system", "developer"})


@dataclass(frozen=True, slots=True)
class Converted:
    body: JSONObject  # the chat-completion body
    dropped: tuple[str, ...]  # client fields with no chat equivalent (named in a response header)
    previous_response_id: str | None
    store: bool


def _fail(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"Invalid '{param}': {message}", param=param)


def _part(part: JSON, where: str) -> JSONObject:
    if not isinstance(part, dict):
        raise _fail(where, "expected an object.")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        text = part.get("text")
        if not isinstance(text, str):
            raise _fail(f"{where}.text", "expected a string.")
        return {"type": "text", "text": text}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise _fail(
                f"{where}.image_url",
                "an image URL or data URL is needed (file_id images are not supported here).",
            )
        image: JSONObject = {"url": url}
        if isinstance(part.get("detail"), str) and part["detail"] != "auto":
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        file: JSONObject = {
            k: part[k] for k in ("file_data", "file_id", "filename") if isinstance(part.get(k), str)
        }
        if "file_data" not in file and "file_id" not in file:
            raise _fail(where, "input_file needs 'file_data' or 'file_id'.")
        return {"type": "file", "file": file}
    raise _fail(
        f"{where}.type",
        f"unsupported content type {kind!r} (input_text, input_image, input_file, output_text).",
    )


def _content(content: JSON, where: str) -> JSON:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail(f"{where}.content", "expected a string or a list of content parts.")
    parts: list[JSON] = [_part(p, f"{where}.content[{i}]") for i, p in enumerate(content)]
    if len(parts) == 1 and isinstance(parts[0], dict) and parts[0].get("type") == "text":
        return parts[0]["text"]
    return parts


def _message(item: JSONObject, where: str) -> JSONObject:
    role = item.get("role")
    if role not in _ROLES:
        raise _fail(f"{where}.role", f"expected one of {', '.join(sorted(_ROLES))}; got {role!r}.")
    content = item.get("content")
    if role == "assistant" and isinstance(content, list):
        refusals = [p for p in content if isinstance(p, dict) and p.get("type") == "refusal"]
        texts = [p for p in content if not (isinstance(p, dict) and p.get("type") == "refusal")]
        message: JSONObject = {"role": "assistant", "content": _content(texts, where) if texts else None}
        if refusals:
            message["refusal"] = "".join(str(p.get("refusal", "")) for p in refusals)
        return message
    return {"role": "system" if role == "developer" else str(role), "content": _content(content, where)}


def _output(value: JSON, where: str) -> JSON:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return _content(value, where)
    raise _fail(f"{where}.output", "expected a string or a list of content parts.")


def input_messages(items: JSON, *, native: bool = False) -> list[JSONObject]:
    """Chat messages for a Responses `input` (a string or a list of items).

    Items the chat form has no message for (`reasoning`; with `native`, any other item type too: built-in
    tool calls and their outputs, MCP items...) are kept, verbatim and in order, on the message that
    follows them (`response_items`), or on the last message (`trailing_items`) when none follows: the
    native door writes them back where they were.
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise _fail("input", "expected a string or a non-empty list of items.")
    out: list[JSONObject] = []
    pending: list[JSON] = []

    def add(message: JSONObject) -> None:
        nonlocal pending
        if pending:
            message["response_items"], pending = pending, []
        out.append(message)

    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise _fail(where, "expected an object.")
        kind = item.get("type", "message")
        if kind == "message":
            add(_message(item, where))
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise _fail(where, "function_call items need 'call_id', 'name' and 'arguments' strings.")
            call: JSON = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            previous = out[-1] if out else None
            if previous is not None and previous["role"] == "assistant":
                # A message and the calls after it (reasoning between them included): one assistant turn,
                # as one response's output is one stored answer.
                calls = previous.setdefault("tool_calls", [])
                assert isinstance(calls, list)
                calls.append(call)
                if pending:
                    kept = previous.setdefault("response_items", [])
                    assert isinstance(kept, list)
                    kept.extend(pending)
                    pending = []
            else:
                add({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise _fail(f"{where}.call_id", "expected a string.")
            add({"role": "tool", "tool_call_id": call_id, "content": _output(item.get("output"), where)})
        elif kind == "reasoning" or (native and isinstance(kind, str)):
            pending.append(item)
        else:
            raise _fail(
                f"{where}.type",
                f"unsupported item type {kind!r} here (message, function_call, function_call_output, reasoning); "
                "built-in tool items need an upstream that serves the Responses API (upstream.responses: native).",
            )
    if pending:
        if not out:
            raise _fail("input", "expected at least one message, function call or function call output.")
        out[-1]["trailing_items"] = pending
    return out


def _tools(tools: JSON) -> tuple[list[JSON], list[str]]:
    if not isinstance(tools, list):
        raise _fail("tools", "expected a list.")
    out: list[JSON] = []
    left_out: list[str] = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _fail(f"tools[{index}]", "expected an object.")
        if tool.get("type") != "function":
            left_out.append(f"tools[{index}]({tool.get('type')})")  # built-in tools run at OpenAI
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(f"tools[{index}].name", "expected a non-empty string.")
        function: JSONObject = {"name": name}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out, left_out


def _tool_choice(choice: JSON) -> JSON:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _fail("tool_choice", "expected 'auto', 'none', 'required' or {'type': 'function', 'name': ...}.")


def _text_format(text: JSON, out: JSONObject) -> None:
    if not isinstance(text, dict):
        raise _fail("text", "expected an object.")
    form = text.get("format")
    if isinstance(form, dict):
        kind = form.get("type")
        if kind == "json_schema":
            schema: JSONObject = {
                k: form[k] for k in ("name", "schema", "strict", "description") if k in form
            }
            out["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif kind == "json_object":
            out["response_format"] = {"type": "json_object"}
        elif kind != "text":
            raise _fail("text.format.type", f"expected 'text', 'json_schema' or 'json_object'; got {kind!r}.")
    if isinstance(text.get("verbosity"), str):
        out["verbosity"] = text["verbosity"]


def to_chat(body: JSONObject, *, native: bool = False) -> Converted:
    """The chat-completion body for a Responses request; `InvalidRequest` names a bad field. `native`:
    the request goes to an upstream serving the Responses API, so every item type is kept."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("model", "'model' is required and must be a non-empty string.")
    if body.get("input") is None:
        raise _fail("input", "'input' is required (a string or a list of items).")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _fail("stream", "expected a boolean.")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise _fail("previous_response_id", "expected a response id string.")
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise _fail("store", "expected a boolean.")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _fail("instructions", "expected a string.")

    messages: list[JSON] = [{"role": "system", "content": instructions}] if instructions else []
    messages.extend(input_messages(body["input"], native=native))
    out: JSONObject = {"model": model, "messages": messages}
    if stream:
        out["stream"] = True
    limit = body.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise _fail("max_output_tokens", "expected a positive integer.")
        out["max_tokens"] = limit
    for key in _PASSED:
        if body.get(key) is not None:
            out[key] = body[key]
    left_out: list[str] = []
    if body.get("tools") is not None:
        tools, left_out = _tools(body["tools"])
        if tools:
            out["tools"] = tools
    if body.get("tool_choice") is not None and "tools" in out:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("text") is not None:
        _text_format(body["text"], out)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        out["reasoning_effort"] = reasoning["effort"]
    dropped = tuple(sorted(k for k in body if k not in _MAPPED and body[k] is not None)) + tuple(left_out)
    return Converted(out, dropped, previous, store)
