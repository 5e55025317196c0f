"""Token counts of long texts are summed line by line (with the lines' counts kept): the sums must equal
tiktoken's own count of the whole text, for both bundled encodings, on texts made to stress the joins."""

from __future__ import annotations

import random

import pytest

from gateway.adapters import tiktoken_tokenizer
from gateway.adapters.tiktoken_tokenizer import (
    AVAILABLE,
    TiktokenTokenizer,
    TiktokenTokenizers,
    load_encoding,
)

# Pieces that meet at line breaks in every way the pre-tokenizer treats differently: punctuation that
# swallows the newline after it (".\n"), "/" that continues a chunk past a newline, contractions,
# combining marks, CJK, emoji, runs of newlines and spaces, carriage returns.
PIECES = [
    "\n", "\n\n", "\r\n", "  \n", ".\n", "\n/", "\nA", "\n1", "\n[", "\n#", "\n…", "\n<", "\né", "\n字",
    "\n\u0301", "\u0301", "'s", "'ll", " the", "http://x.y/z", "```", "\t", "🙂", "ǅ", "ʰ", "…", "—",
    "user: ", "assistant: ", "[2023-05-08 13:56]", "port 8443", "E1234.", "a", "Z", "0", ".", ",", "!", "?",
    "(", ")", "<", ">", "/", "\\", "-", "_", '"', " ",
]  # fmt: skip


def generated(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(60, 400)))


@pytest.mark.parametrize("name", AVAILABLE)
def test_line_by_line_counts_equal_whole_counts(name: str) -> None:
    encoding = load_encoding(name)
    tokenizer = TiktokenTokenizer(encoding)
    rng = random.Random(20261130)
    texts = [generated(rng) for _ in range(3000)]
    # Long enough to be split, with lines long enough to be cached; each text counted twice (cold, cached).
    texts = [t for t in texts if len(t) >= 256]
    assert len(texts) > 1000
    for text in texts + texts:
        assert tokenizer.count(text) == len(encoding.encode_ordinary(text)), repr(text)


def test_retrieved_lines_are_counted_once_and_the_cache_stays_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tiktoken_tokenizer, "_CACHE_CHARS", 4_000)
    encoding = load_encoding("o200k_base")
    tokenizer = TiktokenTokenizer(encoding)
    lines = [
        f"user: message number {i} says the nightly job on host {i} failed with E{i:04d}." for i in range(200)
    ]
    block = "## Retrieved\n" + "\n".join(lines[:20])
    assert tokenizer.count(block) == len(encoding.encode_ordinary(block))
    cached = len(tokenizer._cache)
    assert cached >= 19  # every long line is kept...
    assert tokenizer.count("<ctx>\n" + block + "\n</ctx>") == len(
        encoding.encode_ordinary("<ctx>\n" + block + "\n</ctx>")
    )
    whole = "\n".join(lines)
    assert tokenizer.count(whole) == len(encoding.encode_ordinary(whole))
    # ...within the character bound, oldest dropped first.
    assert tokenizer._cached_chars <= 4_000
    assert sum(len(line) for line in tokenizer._cache) == tokenizer._cached_chars
    assert lines[0] + "\n" not in tokenizer._cache and lines[-1] in tokenizer._cache


@pytest.mark.parametrize("name", AVAILABLE)
def test_retrieved_section_counted_from_its_lines_equals_the_whole_count(name: str) -> None:
    """Retrieval counts its text from each message line's count (kept per message): the sum must be the
    tokenizer's count of the text as sent, however the messages end (punctuation that swallows the
    break, trailing spaces, inner line breaks, CJK) and whatever joins them (date lines, "…", blank
    lines between blocks, the other conversations' blocks)."""
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace
    from typing import Any, cast

    from gateway.config import RetrievalConfig
    from gateway.pipeline.call import HistoryItem
    from gateway.pipeline.context.retrieval import RetrievalSection, _Group
    from gateway.pipeline.context.tail_lines import lines_of

    encoding = load_encoding(name)
    build = cast(Any, SimpleNamespace(tokenizer=TiktokenTokenizer(encoding)))
    section = RetrievalSection(
        cast(Any, None), None, cast(Any, None), RetrievalConfig(), lambda: datetime.now(UTC)
    )
    rng = random.Random(20261203)
    roles = ["user", "assistant", "tool", "system"]
    path = [
        HistoryItem(
            {"role": rng.choice(roles), "content": generated(rng)[: rng.randint(1, 300)]}, None, f"n{i}"
        )
        for i in range(400)
    ]
    day = datetime(2026, 5, 8, 13, 56, tzinfo=UTC)
    for trial in range(150):
        groups: list[_Group] = []
        at = rng.randint(0, 20)
        while at < len(path) - 5 and len(groups) < 8:
            end = at + rng.randint(0, 3)
            when = None if rng.random() < 0.1 else day + timedelta(days=rng.randint(0, 2))
            group = _Group(at, end, 1.0, when)
            marks = {end: day + timedelta(days=9)} if rng.random() < 0.2 else None
            group.lines = lines_of(path, at, end, marks)
            groups.append(group)
            at = end + 1 + rng.choice([0, 0, 1, 5])
        others = []
        for _ in range(rng.choice([0, 0, 1, 2])):
            start = rng.randint(0, len(path) - 3)
            other = _Group(0, 1, 1.0, day)
            other.lines = lines_of(path, start, start + 1)
            others.append(other)
        text, tokens = section._compose(build, groups, others)
        assert text is not None
        assert tokens == len(encoding.encode_ordinary(text)), (trial, text)


@pytest.mark.parametrize("name", AVAILABLE)
def test_joined_texts_counted_from_their_own_counts_equal_the_whole_count(name: str) -> None:
    """`count_concat` (the injected block is counted from its sections' counts): only the text around each
    join is counted again, and the sum is the whole text's count, however the parts meet."""
    from gateway.pipeline.context.block import TAIL_HEADER, block_tokens, injected_block
    from gateway.pipeline.context.section import Proposal

    encoding = load_encoding(name)
    tokenizer = TiktokenTokenizer(encoding)
    rng = random.Random(20261204)
    for _ in range(400):
        texts = [generated(rng)[: rng.randint(0, 500)] for _ in range(rng.randint(1, 5))]
        parts = [(t, None if rng.random() < 0.2 else len(encoding.encode_ordinary(t))) for t in texts]
        whole = "".join(texts)
        assert tokenizer.count_concat(parts) == len(encoding.encode_ordinary(whole)), texts
        proposals = [Proposal(tokens=len(encoding.encode_ordinary(t)), text=t) for t in texts]
        for header in ("", TAIL_HEADER):
            block = injected_block(texts, header) if header else injected_block(texts)
            tokens = (
                block_tokens(proposals, tokenizer, header) if header else block_tokens(proposals, tokenizer)
            )
            assert block is not None and tokens == tokenizer.count_message(block) == len(
                encoding.encode_ordinary(str(block["content"]))
            ) + tokenizer.count_message({"role": "system", "content": ""})


# tiktoken's own ids for this text (taken from a freshly loaded tiktoken 0.14 encoding, Python ranks kept).
IDS = {
    "o200k_base": [13225, 2375, 11, 290, 23496, 402, 3135, 220, 44827, 18, 9363, 25, 457, 7633, 19, 13],
    "cl100k_base": [9906, 1917, 11, 279, 10739, 389, 2700, 220, 24344, 18, 4745, 25, 469, 4513, 19, 13],
}


@pytest.mark.parametrize("name", AVAILABLE)
def test_encodings_count_right_without_their_python_vocabulary(name: str) -> None:
    encoding = load_encoding(name)
    assert "_mergeable_ranks" not in vars(encoding)  # freed at load (issue 29)
    text = "Hello world, the deploy on port 8443 failed: E1234."
    assert encoding.encode_ordinary(text) == IDS[name]
    assert encoding.decode(IDS[name]) == text
    assert TiktokenTokenizer(encoding).count(text) == len(IDS[name])


def test_an_encoding_loads_when_a_model_first_needs_it() -> None:
    tokenizers = TiktokenTokenizers()
    assert tokenizers.for_model("gpt-4o").name == "o200k_base"
    assert tokenizers.for_model("claude-sonnet-4").name == "o200k_base"  # the fallback
    assert set(tokenizers._by_encoding) == {"o200k_base"}
    assert tokenizers.for_model("gpt-4").name == "cl100k_base"
    assert set(tokenizers._by_encoding) == {"o200k_base", "cl100k_base"}
