"""`/v1/messages` to an Anthropic upstream: forwarded natively, read back into the pipeline's chat form.

Going out, a request the pipeline left unchanged is sent as the client's own bytes; a rebuilt one is
written back in Anthropic's form by `to_messages`: the client's fields as they came (tools, thinking,
cache_control on the blocks the gateway did not touch), the leading chat system messages in `system`
(the client's own first, the gateway's stable block after), the volatile tail as text opening the
current user turn, tool results back in user turns, thinking blocks restored with their signatures,
and the gateway's cache breakpoints beside the client's. Coming back, the answer reaches the client as
Anthropic sent it, while `NativeRelay` (streams) and `outcome_of` (JSON) read it into the chat outcome
the store keeps.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from gateway.cache_usage import normalise
from gateway.inbound.chat_form import calls_of
from gateway.inbound.event_relay import BeforeDone, EventRelay
from gateway.inbound.messages_out import error_event, tool_input
from gateway.pipeline.call import ChatOutcome, OutcomeStatus
from gateway.pipeline.forward import cache_marks, markable
from gateway.pipeline.stream import parse_chunk
from gateway.ports import JSON, JSONObject, UpstreamResponse

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "pause_turn": "stop",
    "compaction": "stop",  # paused after the provider compacted (pause_after_compaction)
}


# ------------------------------------------------------------------------------------ chat -> Anthropic


def _block(part: JSON) -> JSON:
    """A chat content part as an Anthropic block (the inverse of messages_in's mapping)."""
    if not isinstance(part, dict):
        return {"type": "text", "text": str(part)}
    kind = part.get("type")
    extra: JSONObject = (
        {"cache_control": part["cache_control"]} if isinstance(part.get("cache_control"), dict) else {}
    )
    if kind == "image_url":
        image = part.get("image_url")
        url = str(image.get("url", "")) if isinstance(image, dict) else ""
        if url.startswith("data:") and ";base64," in url:
            media, data = url[5:].split(";base64,", 1)
            return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}, **extra}
        return {"type": "image", "source": {"type": "url", "url": url}, **extra}
    if kind == "file":
        file = part.get("file")
        data = str(file.get("file_data", "")) if isinstance(file, dict) else ""
        media, _, encoded = data.removeprefix("data:").partition(";base64,")
        document: JSONObject = {
            "type": "document",
            "source": {"type": "base64", "media_type": media, "data": encoded},
        }
        if isinstance(file, dict) and isinstance(file.get("filename"), str):
            document["title"] = file["filename"]
        return {**document, **extra}
    return {"type": "text", "text": str(part.get("text", "")), **extra}


def _blocks(content: JSON) -> list[JSON]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [_block(part) for part in content]
    return [{"type": "text", "text": str(content)}]


def _assistant(message: JSONObject) -> list[JSON]:
    blocks: list[JSON] = []
    for key in ("compaction_blocks", "thinking_blocks"):  # a compaction opens the answer it came with
        kept = message.get(key)
        if isinstance(kept, list):
            blocks.extend(b for b in kept if isinstance(b, dict))
    blocks.extend(_blocks(message.get("content")))
    for call in calls_of(message):
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(call.arguments)}
        )
    return blocks


def _tool_result(message: JSONObject) -> JSON:
    result: JSONObject = {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
    content = message.get("content")
    result["content"] = content if isinstance(content, str) else _blocks(content)
    if message.get("is_error") is True:
        result["is_error"] = True
    return result


def to_messages(chat: JSONObject, original: JSONObject, cache_breaks: Sequence[int] = ()) -> JSONObject:
    """The Anthropic request for a rebuilt chat body; fields the pipeline does not rewrite come from the
    client's `original` request unchanged.

    The leading system messages (the client's, then the gateway's stable block) go to `system`; a later
    one (the gateway's volatile tail) becomes text at the start of the next user turn, after its tool
    results, since Anthropic has no system role mid-conversation and `system` comes before every message
    (the cached prefix would change each turn). `cache_breaks` (indices into the chat messages) get the
    gateway's own breakpoints on their last block, within the limit of four with the client's.
    """
    system: list[JSON] = []
    turns: list[JSONObject] = []
    ends: dict[int, JSONObject] = {}  # chat message index -> the last block it became (a breakpoint's spot)
    pending: list[JSON] = []  # a later system message's blocks, waiting for the next user turn
    messages = chat.get("messages")
    messages = messages if isinstance(messages, list) else []
    leading = next(
        (i for i, m in enumerate(messages) if not (isinstance(m, dict) and m.get("role") in _SYSTEM)),
        len(messages),
    )
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role in _SYSTEM:
            blocks = _blocks(message.get("content"))
            (system if index < leading else pending).extend(blocks)
            _note_end(ends, index, blocks)
            continue
        if role == "tool":
            anthropic_role, blocks = "user", [_tool_result(message)]
        elif role == "assistant":
            anthropic_role, blocks = "assistant", _assistant(message)
        else:
            anthropic_role, blocks = "user", _blocks(message.get("content"))
        _note_end(ends, index, blocks)
        if pending and role not in ("tool", "assistant"):
            blocks, pending = [*pending, *blocks], []  # before the user's words, after any tool results
        elif pending and role == "assistant":
            _add_turn(turns, "user", pending)  # no user words followed: the text ends the user turn
            pending = []
        _add_turn(turns, anthropic_role, blocks)
    if pending and turns and turns[-1]["role"] == "user":
        _add_turn(turns, "user", pending)
    elif pending:
        system.extend(pending)  # nothing after it takes text: where Anthropic can read it at all
    body: JSONObject = {k: v for k, v in original.items() if k not in ("system", "messages")}
    body["messages"] = list(turns)
    if system:
        body["system"] = system
    _add_breakpoints(body, [ends[i] for i in sorted(set(cache_breaks), reverse=True) if i in ends])
    for turn in turns:  # a single plain text block reads as a string, as clients send it
        content = turn["content"]
        if isinstance(content, list) and len(content) == 1:
            only = content[0]
            if isinstance(only, dict) and only.keys() == {"type", "text"}:
                turn["content"] = only["text"]
    return body


_SYSTEM = ("system", "developer")


def _note_end(ends: dict[int, JSONObject], index: int, blocks: list[JSON]) -> None:
    spot = next((b for b in reversed(blocks) if markable(b)), None)
    if isinstance(spot, dict):
        ends[index] = spot


def _add_turn(turns: list[JSONObject], role: str, blocks: list[JSON]) -> None:
    if turns and turns[-1]["role"] == role:  # tool results and the user's words: one turn
        previous = turns[-1]["content"]
        assert isinstance(previous, list)
        previous.extend(blocks)
    else:
        turns.append({"role": role, "content": list(blocks)})


def _in_order(body: JSONObject) -> list[JSONObject]:
    """The blocks of an Anthropic request that may carry a cache_control, in the order Anthropic reads
    them (tools, system, messages)."""
    out: list[JSONObject] = []
    for key in ("tools", "system"):
        value = body.get(key)
        if isinstance(value, list):
            out.extend(b for b in value if isinstance(b, dict))
    messages = body.get("messages")
    for turn in messages if isinstance(messages, list) else []:
        content = turn.get("content") if isinstance(turn, dict) else None
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            out.append(block)
            inner = block.get("content") if block.get("type") == "tool_result" else None
            if isinstance(inner, list):
                out.extend(b for b in inner if isinstance(b, dict))
    return out


def _add_breakpoints(body: JSONObject, spots: list[JSONObject]) -> None:
    """Mark `spots` (blocks this module made, the most wanted first) as the gateway's breakpoints."""
    if not spots:
        return
    order = _in_order(body)
    position = {id(block): n for n, block in enumerate(order)}
    client = [
        (n, b["cache_control"]) for n, b in enumerate(order) if isinstance(b.get("cache_control"), dict)
    ]
    for spot, mark in cache_marks(client, [position[id(s)] for s in spots if id(s) in position]).items():
        order[spot]["cache_control"] = mark


# ------------------------------------------------------------------------------------ Anthropic -> chat


def _usage(usage: JSON) -> JSONObject | None:
    """Anthropic's usage as chat usage: prompt tokens include cache reads and writes, as OpenAI counts;
    both are kept apart too, under Anthropic's names (as LiteLLM's chat usage has them), since chat usage
    has no field for writes."""
    reading = normalise(usage)
    if reading is None:
        return None
    out: JSONObject = {
        "prompt_tokens": reading.input_tokens,
        "completion_tokens": reading.output_tokens,
        "total_tokens": reading.input_tokens + reading.output_tokens,
    }
    if reading.cached_tokens:
        out["prompt_tokens_details"] = {"cached_tokens": reading.cached_tokens}
        out["cache_read_input_tokens"] = reading.cached_tokens
    if reading.cache_write_tokens:
        out["cache_creation_input_tokens"] = reading.cache_write_tokens
    return out


# Input counts: message_start carries them; a later message_delta may repeat them, or say 0 or null.
_INPUT_USAGE = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def _merged_usage(before: JSON, usage: JSONObject) -> JSONObject:
    """message_delta's usage over message_start's, as the SDK merges them, but an input count the
    delta leaves at 0 keeps the one message_start gave."""
    merged: JSONObject = {**before} if isinstance(before, dict) else {}
    for key, value in usage.items():
        if value is None or (key in _INPUT_USAGE and value == 0 and merged.get(key)):
            continue
        merged[key] = value
    return merged


def choice_of(message: JSONObject) -> JSONObject:
    """An Anthropic message as a chat choice (thinking kept in `thinking_blocks` and the provider's
    compaction in `compaction_blocks`, as messages_in does)."""
    texts: list[str] = []
    calls: list[JSON] = []
    thinking: list[JSON] = []
    compaction: list[JSON] = []
    content = message.get("content")
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            arguments = block.get("input", {})
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": orjson.dumps(arguments).decode()},
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(block)
        elif kind == "compaction":
            compaction.append(block)
    chat: JSONObject = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        chat["tool_calls"] = calls
    if thinking:
        chat["thinking_blocks"] = thinking
    if compaction:
        chat["compaction_blocks"] = compaction
    stop = message.get("stop_reason")
    finish = _FINISH.get(stop, "stop") if isinstance(stop, str) else None
    return {"index": 0, "message": chat, "finish_reason": finish}


def outcome_of(http_status: int, body: bytes) -> ChatOutcome:
    """The outcome of a buffered Anthropic answer (or error body)."""
    message = parse_chunk(body)
    if http_status >= 400 or message is None or message.get("type") == "error":
        error = body.decode("utf-8", "replace")[:2000]
        return ChatOutcome(status="failed", http_status=http_status, error=error)
    model = message.get("model")
    return ChatOutcome(
        status="complete",
        http_status=http_status,
        choices=[choice_of(message)],
        usage=_usage(message.get("usage")),
        model=model if isinstance(model, str) else None,
    )


class MessageAccumulator:
    """Rebuilds the Anthropic message from its stream events, as the official SDK does."""

    def __init__(self) -> None:
        self.message: JSONObject = {"content": []}
        self._json: dict[int, list[str]] = {}
        self.started = False
        self.stopped = False
        self.error: str | None = None

    def add(self, event: JSONObject) -> None:
        kind = event.get("type")
        content = self.message["content"]
        assert isinstance(content, list)
        started, block, delta = event.get("message"), event.get("content_block"), event.get("delta")
        if kind == "message_start" and isinstance(started, dict):
            self.started = True
            self.message = {**started, "content": []}
        elif kind == "content_block_start" and isinstance(block, dict):
            content.append(dict(block))
        elif kind == "content_block_delta" and isinstance(delta, dict):
            self._delta(event, delta, content)
        elif kind == "content_block_stop":
            index = event.get("index")
            if isinstance(index, int) and index in self._json and index < len(content):
                block = content[index]
                if isinstance(block, dict):
                    block["input"] = tool_input("".join(self._json.pop(index)))
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict):
                self.message.update({k: v for k, v in delta.items() if v is not None})
            usage = event.get("usage")
            if isinstance(usage, dict):
                self.message["usage"] = _merged_usage(self.message.get("usage"), usage)
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "error":
            self.error = orjson.dumps(event.get("error")).decode()

    def _delta(self, event: JSONObject, delta: JSONObject, content: list[JSON]) -> None:
        index = event.get("index")
        if not isinstance(index, int) or not 0 <= index < len(content):
            return
        block = content[index]
        if not isinstance(block, dict):
            return
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = str(block.get("text", "")) + str(delta.get("text", ""))
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
        elif kind == "thinking_delta":
            block["thinking"] = str(block.get("thinking", "")) + str(delta.get("thinking", ""))
        elif kind == "compaction_delta":  # the whole summary in one delta
            block["content"] = delta.get("content")
        elif kind == "signature_delta":
            block["signature"] = str(block.get("signature", "")) + str(delta.get("signature", ""))
        elif kind == "citations_delta" and isinstance(delta.get("citation"), dict):
            citations = block.setdefault("citations", [])
            if isinstance(citations, list):
                citations.append(delta["citation"])


class NativeRelay(EventRelay):
    """An Anthropic SSE stream relayed frame by frame as it arrives, read into the chat outcome.

    `before_done` runs before `message_stop` is released (thin mode: the next request finds the answer
    stored). An upstream failure mid-stream, or a stream cut before `message_stop`, ends with Anthropic's
    in-band `error` event, which the SDK raises.
    """

    def __init__(self, response: UpstreamResponse, before_done: BeforeDone | None = None) -> None:
        super().__init__(response, before_done)
        self.accumulator = MessageAccumulator()

    async def _read(self, event: JSONObject) -> None:
        self.accumulator.add(event)
        if self.accumulator.stopped:
            await self._release_done()

    def _ended(self) -> bool:
        return self.accumulator.stopped or self.accumulator.error is not None

    def _error_frame(self, status: int, message: str) -> bytes:
        return error_event(status, message)

    def outcome(self, http_status: int, *, disconnected: bool) -> ChatOutcome:
        accumulator = self.accumulator
        disconnected = disconnected and not accumulator.stopped
        error = self._error or accumulator.error
        complete = accumulator.stopped and error is None and not disconnected
        choice = choice_of(accumulator.message)
        message = choice["message"]
        has_any = isinstance(message, dict) and bool(
            message.get("content")
            or message.get("tool_calls")
            or message.get("thinking_blocks")
            or message.get("compaction_blocks")
        )
        status: OutcomeStatus = "complete" if complete else ("partial" if has_any else "failed")
        if not complete:
            choice["finish_reason"] = None
        model = accumulator.message.get("model")
        return ChatOutcome(
            status=status,
            http_status=http_status,
            choices=[choice] if accumulator.started else [],
            usage=_usage(accumulator.message.get("usage")),
            error=error or ("client disconnected" if disconnected else None),
            model=model if isinstance(model, str) else None,
            client_disconnected=disconnected,
        )
