"""The history memo: a resent history is hashed only where it is new, with the same outcome as without it."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from gateway.adapters.cached_store import CachedMessageStore
from gateway.adapters.sql.store import SqlStore
from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizers
from gateway.config import IdentityConfig
from gateway.pipeline.call import ChatCall, HistoryItem
from gateway.pipeline.context.exchanges import newest_exchanges
from gateway.pipeline.history_memo import (
    MESSAGE_OVERHEAD_BYTES,
    HistoryMemo,
    Seen,
    common_prefix,
    message_bytes,
    running_bytes,
)
from gateway.pipeline.ingest import IngestStep
from gateway.ports import ChatPayload, JSONObject


def message(role: str, text: str) -> JSONObject:
    return {"role": role, "content": text}


def test_common_prefix_finds_the_first_difference() -> None:
    rng = random.Random(7)
    base = [message("user", f"m{i}") for i in range(300)]
    for _ in range(300):
        cut = rng.randrange(0, 301)
        other = [dict(m) for m in base[:cut]]  # equal, not identical: compared by value
        other += [message("user", f"changed {i}") for i in range(rng.randrange(0, 5))]
        other += [dict(m) for m in base[cut + len(other) - cut :]] if rng.random() < 0.5 else []
        expected = next(
            (i for i, (a, b) in enumerate(zip(base, other, strict=False)) if a != b),
            min(len(base), len(other)),
        )
        assert common_prefix(base, other) == expected
    assert common_prefix([], base) == 0
    assert common_prefix(base, base[:10]) == 10


def seen(n: int, tag: str = "") -> Seen:
    """n messages of 504 bytes each as the memo counts them (74 characters + the overhead)."""
    messages = [message("user", f"{tag}{i}".ljust(70, ".")) for i in range(n)]
    hashes, items = [f"{i:032x}" for i in range(n)], [HistoryItem(m, 1) for m in messages]
    return Seen(messages, hashes, items, running_bytes(None, 0, messages))


def test_memo_is_bounded_in_bytes_and_forgets_the_least_recently_used() -> None:
    size = 70 + len("user") + MESSAGE_OVERHEAD_BYTES  # every string in the message
    memo = HistoryMemo(max_bytes=100 * size)
    memo.keep("a", seen(40, "a"))
    memo.keep("b", seen(40, "b"))
    assert memo.recall("a", seen(40, "a").messages)[1] == 40  # a is now the most recently used
    memo.keep("c", seen(40, "c"))  # 120 > 100 messages' worth: b goes
    assert memo.recall("b", [])[0] is None
    assert memo.recall("a", [])[0] is not None and memo.recall("c", [])[0] is not None
    assert memo.bytes_held == 80 * size
    memo.keep("a", seen(10, "a"))  # replaced, not added
    assert memo.bytes_held == 50 * size
    memo.keep("d", seen(101, "d"))  # larger than the whole memo: not kept, evicts nothing
    assert memo.recall("d", [])[0] is None and len(memo) == 2


def test_a_message_counts_every_string_in_it_and_a_resent_prefix_is_not_counted_again() -> None:
    text = {"role": "user", "content": "x" * 1000}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 5000}}
    parts = {"role": "user", "content": [{"type": "text", "text": "y" * 500}, image]}
    call = {"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "z" * 300}}]}
    # role + text; role + "text" + text + the image part's strings (its base64 data above all); role + args
    expected = [4 + 1000, 4 + 4 + 500 + 9 + 22 + 5000, 9 + 300]
    assert [message_bytes(m) - MESSAGE_OVERHEAD_BYTES for m in (text, parts, call)] == expected
    first = seen(3)
    # Only the two new messages are counted; the three shared ones come from what was seen.
    chain = [*first.messages, text, parts]
    one, two = message_bytes(text), message_bytes(parts)
    assert running_bytes(first, 3, chain) == [
        *first.running_bytes,
        first.bytes + one,
        first.bytes + one + two,
    ]
    assert running_bytes(first, 1, chain[:1]) == first.running_bytes[:1]


def scripted_requests() -> list[list[JSONObject]]:
    """A chat resent in full, then edited far back, regenerated, taken back to an older branch, and a
    message changed only by an extra field the canonical form drops."""
    system = message("system", "Be brief.")
    history: list[JSONObject] = [system]
    bodies: list[list[JSONObject]] = []
    for turn in range(60):
        history = [*history, message("user", f"question {turn} about item-{turn:03d}")]
        bodies.append(history)
        history = [*history, message("assistant", f"answer {turn}")]
    edited = [*history[:21], message("user", "question 10, edited"), message("assistant", "new answer")]
    bodies += [edited, [*edited, message("user", "and then?")]]
    regenerated = [*history[:-1], message("assistant", "another answer 59")]
    bodies += [
        [*regenerated, message("user", "next")],
        [*history, message("user", "back on the first branch")],
    ]
    extra = [dict(m) for m in history]
    extra[30] = {**extra[30], "refusal": None}  # an SDK echoing a null field back: the same message
    bodies.append([*extra, message("user", "one more")])
    return bodies


async def ingest_all(tmp_path: Path, name: str, memo: HistoryMemo | None) -> list[dict[str, Any]]:
    sql = SqlStore.open(f"sqlite:///{tmp_path / name}.db")
    step = IngestStep(CachedMessageStore(sql, 10_000), TiktokenTokenizers(), IdentityConfig(), 600, memo)
    outcomes = []
    for number, messages in enumerate(scripted_requests()):
        body: JSONObject = {"model": "gpt-4o", "messages": list(messages)}
        call = ChatCall(f"r{number}", "acme", body, b"", [("x-user-id", "u1")], 0.0)
        await step(call, ChatPayload(body, b""))
        state = call.state
        outcomes.append(
            {
                "items": [(i.message, i.tokens, i.node_id) for i in state.items],
                "history_tokens": state.history_tokens,
                "appended": state.appended,
                "leaf": (state.leaf_id, state.leaf_depth, state.leaf_path_tokens),
            }
        )
    await sql.aclose()
    return outcomes


def test_ingest_with_the_memo_equals_ingest_without_it(tmp_path: Path) -> None:
    memo = HistoryMemo(max_bytes=1_000_000)
    without = asyncio.run(ingest_all(tmp_path, "plain", None))
    with_memo = asyncio.run(ingest_all(tmp_path, "memo", memo))
    assert len(with_memo) == len(without)
    for plain, memoised in zip(without, with_memo, strict=True):
        assert [(m, n) for m, _, n in memoised.pop("items")] == [(m, n) for m, _, n in plain["items"]]
        assert memoised == {k: v for k, v in plain.items() if k != "items"}
    # Token counts: the same wherever the plain step read them (the newest 600 tokens); the memo may know
    # older ones too (the request that stored a message counted it).
    tokens = [
        [t for _, t, _ in o["items"]]
        for o in asyncio.run(ingest_all(tmp_path, "memo2", HistoryMemo(1_000_000)))
    ]
    for plain, known in zip(without, tokens, strict=True):
        assert all(p is None or p == k for p, k in zip([t for _, t, _ in plain["items"]], known, strict=True))
    assert without[59]["items"][-1][1] is not None and without[59]["items"][5][1] is None
    assert (
        len(memo) == 1 and memo.bytes_held > 100 * MESSAGE_OVERHEAD_BYTES
    )  # it was used: the chat's newest chain is held


def test_newest_exchanges_walks_back_by_whole_exchanges() -> None:
    roles = ["system", "assistant", "user", "assistant", "tool", "user", "user", "assistant", "tool"]
    items = [HistoryItem(message(role, str(i)), 1) for i, role in enumerate(roles)]
    got = [[int(str(i.message["content"])) for i in e] for e in newest_exchanges(items)]
    assert got == [[6, 7, 8], [5], [2, 3, 4], [0, 1]]
    assert list(newest_exchanges([])) == []
    assert [len(e) for e in newest_exchanges(items[2:5])] == [3]
