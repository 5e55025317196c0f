"""SSE framing and answer assembly, on byte streams cut at every possible point."""

from __future__ import annotations

import orjson

from gateway.pipeline.stream import ChatAccumulator, FrameSplitter, frame_data, is_usage_only, parse_chunk

FRAMES = [
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
    b": keep-alive comment\n\n",
    b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\r\n\r\n',
    b'data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function",'
    b'"function":{"name":"f","arguments":"{\\"a\\""}}]}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":": 1}"}}]}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\n\n',
    b"data: [DONE]\n\n",
]
STREAM = b"".join(FRAMES)


def test_frames_survive_every_cut_point() -> None:
    for cut in range(len(STREAM) + 1):
        splitter = FrameSplitter()
        frames = [*splitter.feed(STREAM[:cut]), *splitter.feed(STREAM[cut:])]
        assert frames == FRAMES, cut
        assert splitter.rest() == b""


def test_byte_by_byte_and_truncated_rest() -> None:
    splitter = FrameSplitter()
    frames = [frame for i in range(len(STREAM) - 3) for frame in splitter.feed(STREAM[i : i + 1])]
    assert frames == FRAMES[:-1]
    assert splitter.rest() == b"data: [DONE"


def test_accumulator_assembles_content_tool_calls_and_usage() -> None:
    accumulator = ChatAccumulator()
    for frame in FRAMES:
        data = frame_data(frame)
        if data is None or data == b"[DONE]":
            continue
        chunk = parse_chunk(data)
        assert chunk is not None
        accumulator.add(chunk)
    assert accumulator.choices() == [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Hello",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
                ],
            },
            "finish_reason": "tool_calls",
        }
    ]
    assert accumulator.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert accumulator.finished


def test_frame_data_and_usage_detection() -> None:
    assert frame_data(b": comment\n\n") is None
    assert frame_data(b"event: x\ndata: a\ndata: b\n\n") == b"a\nb"
    usage_chunk = parse_chunk(frame_data(FRAMES[-2]) or b"")
    assert usage_chunk is not None and is_usage_only(usage_chunk)
    assert not is_usage_only(orjson.loads(frame_data(FRAMES[3]) or b""))
    assert parse_chunk(b"not json") is None
