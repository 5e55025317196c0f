"""The full-text side both LanceDB adapters share: how `text` is indexed and how a question is asked of it.

The engine's word tokenizers keep a run of Chinese or Japanese characters (or a Korean word with its
particles) as one token, and its n-gram tokenizer breaks English words and numbers apart too; so the
indexed text and the query both spell each such run as its overlapping character bigrams and its
characters (`cjk_terms`), and the word tokenizer keeps English whole.
"""

from __future__ import annotations

from lancedb.index import FTS
from lancedb.query import BooleanQuery, FullTextOperator, FullTextQuery, MatchQuery, Occur, PhraseQuery

from gateway.adapters.keyword_rank import COMPOUND, MAX_PHRASES, MAX_QUERY_TERMS, WORD
from gateway.text import cjk_terms

# For chat-like text (file names, error codes, ports, hashes): split on punctuation so "E1234." matches,
# stem, keep positions for the phrase clauses, and keep tokens up to 80 characters (sha256 hashes).
FTS_CONFIG = FTS(
    base_tokenizer="simple",
    with_position=True,
    max_token_length=80,
    lower_case=True,
    stem=True,
    remove_stop_words=True,
    ascii_folding=True,
)


def keyword_query(text: str) -> FullTextQuery | None:
    """A full-text query for the user's plain text, or None when it has no word to look for.

    Built as query objects, never parsed: quotes, colons, parentheses and AND/OR are just text here.
    """
    if not WORD.search(text):
        return None
    phrases = list(dict.fromkeys(COMPOUND.findall(text)))[:MAX_PHRASES]
    text = cjk_terms(text)
    words = text.split()
    if len(words) > MAX_QUERY_TERMS:
        text = " ".join(list(dict.fromkeys(words))[:MAX_QUERY_TERMS])
    # Every argument spelled out (mypy does not see pydantic's field defaults): any word may match (OR),
    # exactly (fuzziness 0: "E1234" must not find "E1235").
    match = MatchQuery(
        text,
        "text",
        boost=1.0,
        fuzziness=0,
        max_expansions=50,
        operator=FullTextOperator.OR,
        prefix_length=0,
        document_granularity=None,
    )
    if not phrases:
        return match
    clauses: list[tuple[Occur, FullTextQuery]] = [(Occur.SHOULD, match)]
    clauses += [
        (Occur.SHOULD, PhraseQuery(phrase, "text", slop=0, document_granularity=None)) for phrase in phrases
    ]
    return BooleanQuery(clauses)
