"""Retrieval's per-message memo (lowered texts, words in capitals, line tokens) stays within its byte bound and always
answers what it would compute afresh."""

from __future__ import annotations

import sys

from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizer, load_encoding
from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.retrieval_memo import ENTRY_BYTES, WORD_BYTES, MessageMemo
from gateway.pipeline.context.tail_lines import line_of


def test_the_memo_answers_as_computed_afresh_and_stays_within_its_bytes() -> None:
    tokenizer = TiktokenTokenizer(load_encoding("o200k_base"))
    limit = 40_000
    memo = MessageMemo(limit=limit)
    items = [
        HistoryItem(
            {"role": "user", "content": f"Deploy {i} of the Ledger service past the DLQ: 部署 {i} " * 8},
            None,
            f"n{i}",
        )
        for i in range(300)
    ]
    most = 0
    for _ in range(2):  # the second round is answered from what is left, or made again
        for item in items:
            text = memo.lowered(item)
            assert text == item.message["content"].lower()
            tokens = memo.item_tokens(tokenizer, item)
            assert tokens == tokenizer.count(line_of(item) + "\n")
            assert memo.capitals(item) == {"dlq"}  # "Ledger" and "Deploy" are no capitals
            counted = sum(sys.getsizeof(t) + ENTRY_BYTES for t in memo.lowered_texts.values())
            counted += sum(ENTRY_BYTES + WORD_BYTES * len(c) for c in memo.capitals_of.values())
            assert memo.held == counted + ENTRY_BYTES * len(memo.line_tokens)
            assert memo.held <= limit
            most = max(most, len(memo.lowered_texts))
    assert 10 < most < len(items)  # it filled, was forgotten at once, and filled again
    unkept = HistoryItem({"role": "user", "content": "No ID"}, None, None)
    held = memo.held
    assert memo.lowered(unkept) == "no id" and memo.held == held  # a message not stored is not kept
