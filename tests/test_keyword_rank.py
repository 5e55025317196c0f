"""The in-memory keyword ranking of cached conversations (gateway/adapters/keyword_rank.py): terms made as
the table's full-text index makes them, BM25, identifier phrases, and postings that never change once built.
The same ranking cases run against the table's index in tests/test_lance_index.py (the `scoped` fixture)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from gateway.adapters.keyword_rank import Analyzer, KeywordQuery, Postings, ViewRanker
from gateway.jobs.embed import index_rows
from gateway.records import StoredMessage, StoredNode
from gateway.text import cjk_terms


def ranked(texts: list[str], question: str) -> list[int]:
    """Rows of `texts` matching `question`, best first."""
    analyzer = Analyzer()
    postings = Postings().extended(analyzer.terms(t) for t in texts)
    query = analyzer.query(question)
    if query is None:
        return []
    scores = postings.scores(query)
    return [int(i) for i in np.argsort(-scores, kind="stable") if scores[i] > 0]


def test_terms_are_lower_cased_folded_stemmed_and_stop_words_dropped() -> None:
    terms, positions = Analyzer().terms("The Café was DEPLOYING parse_config.py to port 8443")
    assert terms == ["cafe", "deploy", "pars", "config", "py", "port", "8443"]
    assert positions == [1, 3, 4, 5, 6, 8, 9]  # dropped words keep their places


def test_stemming_finds_other_forms_and_exact_codes_do_not_match_their_neighbours() -> None:
    texts = ["we deployed it on friday", "error E1235 again", "error E1234 at startup", "lunch"]
    assert ranked(texts, "when did we deploy?") == [0]
    assert ranked(texts, "E1234") == [2]
    assert ranked(texts, "what is for lunch") == [3]


def test_a_rare_term_outweighs_a_common_one_and_a_short_row_a_long_one() -> None:
    texts = ["config changed", "config changed", "config changed", "config and the kafka broker"]
    assert ranked(texts, "kafka config")[0] == 3
    short_long = ["kafka", "kafka broker upgrade notes from the long meeting on tuesday"]
    assert ranked(short_long, "kafka") == [0, 1]


def test_an_identifier_ranks_rows_holding_it_whole_above_rows_holding_its_pieces() -> None:
    texts = [
        "moved parse.py and config.py into the tools folder",
        "the config parser is in python",
        "the bug is in parse_config.py near line 40",
        "parse config py",  # its pieces in order, but not one identifier: still adjacent terms
    ]
    order = ranked(texts, "parse_config.py")
    assert order[0] in (2, 3) and order.index(2) < order.index(0)
    # A stop word inside an identifier keeps its place: "state-of-the-art" is not "state art".
    assert ranked(["state art", "state-of-the-art design"], "state-of-the-art")[0] == 1


def test_long_tokens_are_dropped_but_hashes_are_kept() -> None:
    sha = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    texts = [f"the digest is {sha}", "x" * 90 + " other"]
    assert ranked(texts, sha) == [0]
    assert ranked(texts, "x" * 90) == []


@pytest.mark.parametrize("question", ["", "   ", "?!", "___", "the and of"])
def test_a_question_without_a_searchable_word_has_no_query(question: str) -> None:
    assert Analyzer().query(question) is None


def test_chinese_runs_are_matched_by_bigrams() -> None:
    texts = ["我们把端口改成8443了", "数据库迁移到PostgreSQL 17之后连接池报错"]
    assert ranked([cjk_terms(t) for t in texts], "端口改成多少了") == [0]
    assert ranked([cjk_terms(t) for t in texts], "连接池") == [1]


def test_a_chinese_word_written_shorter_still_matches_by_its_characters() -> None:
    """扩缩容 and 扩容 share no bigram; their characters 扩 and 容 are terms too."""
    texts = ["关于扩容的争论：最后定了，队列深度超过 1000 时扩容", "数据库迁移到PostgreSQL 17之后连接池报错"]
    assert cjk_terms("扩容", singles=False) == " 扩容 "
    assert cjk_terms("扩缩容") == " 扩缩 缩容 扩 缩 容 "
    assert ranked([cjk_terms(t, singles=False) for t in texts], "扩缩容规则") == []
    assert ranked([cjk_terms(t) for t in texts], "扩缩容规则") == [0]


def test_a_name_written_against_a_chinese_character_is_still_its_own_word() -> None:
    texts = ["Wang Fang 对search-edge 的夜间单副本又提了一个担心", "夜里 price-cache 只跑一个副本"]
    assert cjk_terms("对search-edge 的") == " 对 search-edge  的 "  # a lone character: itself, once
    assert ranked([cjk_terms(t) for t in texts], "search") == [0]


def test_postings_never_change_once_built() -> None:
    analyzer = Analyzer()
    first = Postings().extended([analyzer.terms("kafka broker")])
    second = first.extended([analyzer.terms("kafka again"), analyzer.terms("nothing here")])
    query = KeywordQuery(("kafka",))
    assert first.rows == 1 and list(first.scores(query) > 0) == [True]
    assert second.rows == 3 and list(second.scores(query) > 0) == [True, True, False]
    assert first.terms["kafka"].rows.tolist() == [0]
    assert second.terms["kafka"].rows.tolist() == [0, 1]
    assert first.extended([]) is first


def test_postings_hold_each_rows_counts_and_positions_however_the_rows_arrive() -> None:
    """A term said twice in a row: one entry for the row, its count 2, both positions in order (a
    dropped stop word keeps its place); the same rows added one batch at a time give the same postings
    (the cache grows as the index writes)."""
    analyzer = Analyzer()
    docs = [
        analyzer.terms("retry the retry queue"),
        analyzer.terms(""),
        analyzer.terms("queue depth and retry budget"),
        analyzer.terms("budget queue queue"),
    ]
    whole = Postings().extended(docs)
    retry = whole.terms["retri"]  # stemmed, as the table's index stems
    assert (retry.rows.tolist(), retry.counts.tolist(), retry.positions.tolist()) == (
        [0, 2],
        [2, 1],
        [0, 2, 3],
    )
    queue = whole.terms["queue"]
    assert (queue.rows.tolist(), queue.counts.tolist(), queue.positions.tolist()) == (
        [0, 2, 3],
        [1, 1, 2],
        [3, 0, 1, 2],
    )
    assert whole.lengths.tolist() == [3, 0, 4, 3]
    pieces = Postings().extended(docs[:1]).extended([]).extended(docs[1:3]).extended(docs[3:])
    assert pieces.lengths.tolist() == whole.lengths.tolist()
    assert pieces.terms.keys() == whole.terms.keys()
    for term, posting in whole.terms.items():
        held = pieces.terms[term]
        assert held.rows.tolist() == posting.rows.tolist()
        assert held.counts.tolist() == posting.counts.tolist()
        assert held.positions.tolist() == posting.positions.tolist()
    with pytest.raises(ValueError):
        Postings().extended([(["queue"], [])])


def test_a_views_terms_made_line_by_line_are_the_terms_of_its_whole_text() -> None:
    """`view_terms` remembers each line's terms and shifts their positions by the tokens before it: the
    same terms and positions as `terms` over the whole text (stop words keep their places, CJK spelled
    as bigrams and characters, empty lines, a line too long to remember), first time and again."""
    lines = [
        "Set the retry budget to 3 for the Kafka consumer.",
        "",
        cjk_terms("把 price-cache 的副本数改成 2，夜里只跑一个副本"),
        "| code | http |\n|---|---|\n| not_found | 404 |",
        "word " * 600,  # longer than the lines remembered
        "The retry budget is 3 now, not 5.",
    ]
    views = ["\n".join(lines[i : i + 3]) for i in range(len(lines) - 2)] + lines
    analyzer = Analyzer()
    for _ in range(2):
        for view in views:
            assert analyzer.view_terms(view) == Analyzer().terms(view)


def test_views_of_a_history_in_hand_rank_as_the_index_will_once_it_writes_them() -> None:
    """`ViewRanker` ranks a history the index has not written yet (a long history that just arrived) over
    the same three views a message gets in the index (`jobs.embed.index_rows`), with the same scores."""
    texts = [
        "We moved the nightly export to the new cluster.",
        "Great, did the export keep its schedule?",
        "",  # an empty tool-call shell: no views of its own
        "Yes, 02:00 UTC. 服务 器 迁移 完成 了。",
        "The billing_reconcile_v2.py job failed twice after the export.",
        "Retry it with the smaller batch, then check the export logs.",
    ]
    at = datetime(2026, 1, 1, tzinfo=UTC)
    path = [
        StoredMessage(
            StoredNode(f"n{i}", "c", f"n{i - 1}" if i else None, i, "user", 5, 5 * i), {"content": t}, at
        )
        for i, t in enumerate(texts)
    ]
    rows = index_rows("acme", None, path, len(path))
    analyzer = Analyzer()
    for question in ("When did the export run?", "billing_reconcile_v2.py", "服务器迁移", "batch logs"):
        query = analyzer.query(question)
        assert query is not None
        scores = Postings().extended(analyzer.terms(cjk_terms(r.text)) for r in rows).scores(query)
        expected = sorted(
            ((r.node_id, r.view, round(float(s), 4)) for r, s in zip(rows, scores, strict=True) if s > 0),
            key=lambda hit: (-hit[2], hit[0], hit[1]),
        )
        got = sorted(
            ((f"n{i}", view, round(score, 4)) for i, view, score in ViewRanker()(question, texts, 100)),
            key=lambda hit: (-hit[2], hit[0], hit[1]),
        )
        assert got == expected, question
        assert got  # every question matches something here
    best = ViewRanker()("When did the export run?", texts, 2)
    every = ViewRanker()("When did the export run?", texts, 100)
    assert [hit[2] for hit in best] == [hit[2] for hit in every[:2]]  # the best two (ties in any order)


def test_the_ranking_in_hand_follows_each_call_s_own_texts_though_it_keeps_their_terms() -> None:
    """Terms are kept per text, not per position: a history whose messages moved or changed ranks by what
    it holds now, and a term counted twice in a message still weighs twice."""
    rank = ViewRanker()
    first = rank("pg-main disk", ["pg-main disk at 91%", "deploy done", "tea"], 10)
    assert first[0][:2] == (0, "m")
    again = rank("pg-main disk", ["tea", "deploy done", "pg-main disk at 91%"], 10)
    assert again[0][:2] == (2, "m")
    twice = rank("disk", ["disk disk full", "disk full now", "tea"], 10)
    assert twice[0][:2] == (0, "m") and twice[0][2] > next(s for i, v, s in twice if (i, v) == (1, "m"))
