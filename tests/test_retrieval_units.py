"""The retrieval section's pure parts, without a gateway: term and recency weights (ranking.py), the second
hop's leads and how its hits rank (retrieval_hop.py), groups (retrieval_groups.py) and the section's text
(retrieval_compose.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from gateway.adapters.keyword_rank import ViewRanker
from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.answer_kinds import asked_kinds, holds_kind
from gateway.pipeline.context.question import exact_terms, topic
from gateway.pipeline.context.ranking import (
    FOREIGN_SEMANTIC_WEIGHT,
    RARE_TERM,
    RRF_K,
    SPEAKER_WEIGHT,
    TERMLESS_SEMANTIC_WEIGHT,
    Candidate,
    acronyms_held,
    boost,
    favour_speaker,
    for_meaning,
    fuse,
    participants,
    semantic_weight,
    term_weights,
)
from gateway.pipeline.context.retrieval import POOL_GROWTH, POOL_ROOM, pool_size
from gateway.pipeline.context.retrieval_compose import HEADER, OTHER_HEADER, compose
from gateway.pipeline.context.retrieval_groups import (
    DATE_LINE_TOKENS,
    SEPARATOR_TOKENS,
    Group,
    groups_of,
    other_group,
    said_above,
)
from gateway.pipeline.context.retrieval_hop import (
    HOP_COMMON,
    HOP_SHARE,
    HOP_TERMS,
    Asked,
    capitalised_inside,
    follow,
    leads,
    query_value,
    replies_about,
    second_hop,
    word_pairs,
)
from gateway.pipeline.context.retrieval_search import blended
from gateway.pipeline.context.retrieval_unindexed import MAX_MESSAGES, unembedded, waiting_for_vectors
from gateway.pipeline.context.retrieval_window import OLD_COMPARED, old_outranks_window
from gateway.pipeline.context.tail_lines import lines_of
from gateway.records import IndexBacklog, IndexHit, SearchQuery, SearchResult

DAY = datetime(2024, 5, 8, 13, 56, tzinfo=UTC)


def path_of(*texts: str, roles: tuple[str, ...] = ("user", "assistant")) -> list[HistoryItem]:
    return [
        HistoryItem({"role": roles[i % len(roles)], "content": t}, None, f"n{i}") for i, t in enumerate(texts)
    ]


def positions_of(path: list[HistoryItem]) -> dict[str, int]:
    return {item.node_id: i for i, item in enumerate(path) if item.node_id is not None}


def lowered_texts(path: list[HistoryItem]) -> dict[str, str]:
    return {item.node_id or "": item.message["content"].lower() for item in path}


def one_token(_: HistoryItem) -> int:
    return 1


# ranking.py


def test_a_term_weighs_less_the_more_candidates_hold_it_and_an_absent_one_not_at_all() -> None:
    texts = {f"n{i}": "etl-07 restarted" for i in range(RARE_TERM * 2)}
    texts["n99"] = "error e1234 at startup etl-07"
    weights = term_weights(("e1234", "etl-07", "absent-term"), texts)
    assert list(weights) == ["e1234", "etl-07"]  # sorted, matched only
    assert weights["e1234"] == pytest.approx(2.0 / RRF_K)
    assert weights["etl-07"] == pytest.approx(2.0 / RRF_K * RARE_TERM / (RARE_TERM * 2 + 1))


def test_a_term_inside_another_token_is_not_held() -> None:
    assert term_weights(("10",), {"a": "in 2010 we moved"}) == {}


def test_an_acronym_is_held_only_where_a_candidate_writes_it_in_capitals() -> None:
    raw = {
        "n0": "Yuki raised another worry about killing the DLQ: poison messages block the partition.",
        "n1": "the dlq folder, in lower case",
        "n2": "RPS",
    }
    texts = {n: text.lower() for n, text in raw.items()}
    assert acronyms_held(["dlq", "rps", "ttl"], texts, raw.__getitem__) == ["dlq", "rps"]
    assert acronyms_held(["dlq"], {"n1": texts["n1"]}, raw.__getitem__) == []
    assert acronyms_held(["dl"], texts, raw.__getitem__) == []  # inside "DLQ" is no whole token


def test_boost_adds_terms_and_recency_then_sorts_best_first() -> None:
    ranked = [Candidate("n0", 0.1), Candidate("n1", 0.1), Candidate("n2", 0.1)]
    texts = {"n0": "the e1234 error", "n1": "nothing", "n2": "nothing either"}
    positions = {"n0": 0, "n1": 1, "n2": 2}
    boost(ranked, texts, {"e1234": 0.5}, positions, 3, recency=1.0)
    assert [c.node_id for c in ranked] == ["n0", "n2", "n1"]
    assert ranked[0].score == pytest.approx(0.6)
    assert ranked[1].score == pytest.approx(0.1 + 1.0 / RRF_K * 2 / 3)


def test_a_question_naming_one_participant_ranks_that_ones_own_turns_first() -> None:
    texts = {
        "n0": "caroline: melanie told me she went swimming",
        "n1": "melanie: i'm off to go swimming with the kids",
        "n2": "caroline: the support group was great",
        "n3": "melanie: we went camping",
        "n4": "note: swimming pool closed",  # opens one text of seven: no participant
        "n5": "caroline: i painted a sunset",
        "n6": "melanie: pottery class was fun",
    }
    assert participants(texts.values()) == {"caroline", "melanie"}

    def ranked() -> list[Candidate]:
        return [Candidate(n, 1.0 - i / 100) for i, n in enumerate(texts)]

    shown = ranked()
    assert favour_speaker(shown, texts, "what activities does melanie partake in?") == "melanie"
    assert [c.node_id for c in shown][:3] == ["n1", "n3", "n6"]
    assert shown[0].score == pytest.approx(0.99 + SPEAKER_WEIGHT / RRF_K)
    # Both named, or neither: the order stands.
    # A question-and-answer transcript's one-letter labels are no one's name.
    assert participants(["q: where?", "a: here", "q: when?", "a: now", "q: why?", "a: because"]) == set()
    for question in ("what did caroline say about melanie's kids?", "what did the note say?"):
        shown = ranked()
        assert favour_speaker(shown, texts, question) is None
        assert [c.node_id for c in shown] == list(texts)


def test_a_chinese_transcripts_speakers_are_read_with_a_full_width_colon() -> None:
    said = [
        "李娜：我去游泳了",
        "张伟：周末去爬山了",
        "李娜：好的",
        "张伟：还去了博物馆",
        "李娜：嗯",
        "张伟：累了",
    ]
    texts = {f"n{i}": text for i, text in enumerate(said)}
    shown = [Candidate(n, 1.0 - i / 100) for i, n in enumerate(texts)]
    assert favour_speaker(shown, texts, "张伟周末做了什么？") == "张伟"
    assert [c.node_id for c in shown][:3] == ["n1", "n3", "n5"]


def test_the_search_by_meaning_reads_a_question_without_the_participants_it_names() -> None:
    said = ["melanie: we went camping", "caroline: so jealous", "melanie: the kids loved it"] * 3
    assert for_meaning("What activities has Melanie done with her family?", said) == (
        "What activities has done with her family?"
    )
    # Possessives go with the name; both participants go.
    assert for_meaning("What did Melanie’s kids paint?", said) == "What did kids paint?"
    assert for_meaning("What are Caroline and Melanie's hobbies?", said) == "What are and hobbies?"
    # A name that labels no turns, or a question about the person alone, is read as it is.
    assert for_meaning("What did Priya paint?", said) == "What did Priya paint?"
    assert for_meaning("Who is Caroline?", said) == "Who is Caroline?"
    assert (
        for_meaning("What did Melanie paint?", ["we went camping", "so jealous"]) == "What did Melanie paint?"
    )
    # A CJK name is no whole word.
    chinese = ["李娜：我去游泳了", "张伟：周末去爬山了"] * 3
    assert for_meaning("张伟周末做了什么？", chinese) == "周末做了什么？"


def test_two_rankings_by_meaning_blend_by_reciprocal_rank_each_row_once() -> None:
    def hit(node_id: str, view: str, cosine: float) -> IndexHit:
        return IndexHit(node_id, "c", view, 0, DAY, cosine)

    topic = [hit("a", "m", 0.61), hit("b", "m", 0.55), hit("c", "p", 0.50)]
    named = [hit("c", "p", 0.58), hit("d", "m", 0.57), hit("a", "m", 0.40)]
    out = blended(topic, named)
    # "a" and "c", in both, come first; each row comes once, at its higher cosine.
    assert [(h.node_id, h.view) for h in out] == [("a", "m"), ("c", "p"), ("b", "m"), ("d", "m")]
    assert [h.score for h in out] == [0.61, 0.58, 0.55, 0.57]
    assert blended(topic, []) == topic


def test_by_keyword_a_message_counts_once_at_its_best_view_by_meaning_every_view_counts() -> None:
    def hit(node_id: str, view: str) -> IndexHit:
        return IndexHit(node_id, "c", view, 0, DAY, 1.0)

    # n0 asked the question in passing: its views and its neighbour's all hold its words.
    keyword = [hit("n0", "m"), hit("n0", "p"), hit("n1", "w"), hit("n0", "w"), hit("n2", "m")]
    semantic = [hit("n2", "m"), hit("n2", "p")]
    scores = {c.node_id: c.score for c in fuse(SearchResult(semantic, keyword))}
    assert scores["n0"] == pytest.approx(1 / RRF_K)
    assert scores["n1"] == pytest.approx(1 / (RRF_K + 1))
    assert scores["n2"] == pytest.approx(1 / (RRF_K + 2) + 1 / RRF_K + 1 / (RRF_K + 1))


def test_meaning_weighs_more_where_the_question_names_no_exact_term_and_less_on_foreign_text() -> None:
    def weight(question: str, english_only: bool = True, embedded: bool = True) -> float:
        return semantic_weight(question, exact_terms(question), english_only, embedded)

    assert weight("What worried us about moving session handling to the edge?") == TERMLESS_SEMANTIC_WEIGHT
    assert weight("Which port does ledger-api listen on?") == 1.0
    # A history still waiting for its vectors is ranked by meaning only in part: no more weight there.
    assert weight("What worried us about moving session handling to the edge?", embedded=False) == 1.0
    assert weight("边缘会话存储让我们担心什么？") == FOREIGN_SEMANTIC_WEIGHT
    assert weight("边缘会话存储让我们担心什么？", english_only=False) == TERMLESS_SEMANTIC_WEIGHT
    # Past MAX_MESSAGES the history is not ranked in hand, but it still waits for its vectors.
    waiting = IndexBacklog(unsearchable=0, unembedded=MAX_MESSAGES + 1)
    assert waiting_for_vectors(waiting, 0) and not unembedded(waiting, 0, MAX_MESSAGES + 1)
    assert not waiting_for_vectors(IndexBacklog(unsearchable=0, unembedded=2), 1)  # a live chat's newest
    # The weight scales the ranking by meaning: alone in each ranking at the top, meaning wins.
    hits = SearchResult([IndexHit("m", "c", "m", 0, DAY, 0.9)], [IndexHit("k", "c", "m", 0, DAY, 1.0)])
    assert [c.node_id for c in fuse(hits, TERMLESS_SEMANTIC_WEIGHT)] == ["m", "k"]


def test_more_room_searches_deeper_up_to_a_bound() -> None:
    assert pool_size(120, 0) == 120  # room unknown
    assert pool_size(120, 2_000) == pool_size(120, POOL_ROOM) == 120
    assert pool_size(120, POOL_ROOM * 3 // 2) == 180
    assert pool_size(120, 60_000) == round(120 * POOL_GROWTH)


# retrieval_window.py


def test_an_old_message_outranks_the_window_only_where_it_holds_more_of_the_question() -> None:
    rank = ViewRanker()
    window = ["I restarted tenant-admin after the deploy.", "Good, tenant-admin is healthy again."]
    old = ["Lunch was fine.", "tenant-admin listens on port 8443."]
    assert old_outranks_window(rank, "Which port does tenant-admin listen on?", window, old)
    # The window says the port too: it answers the question, nothing old is needed.
    said = [*window, "tenant-admin listens on port 8443."]
    assert not old_outranks_window(rank, "Which port does tenant-admin listen on?", said, old)
    # Only the first OLD_COMPARED old messages are compared; none at all is no reason to retrieve.
    assert not old_outranks_window(rank, "Which port?", window, [*["Lunch."] * OLD_COMPARED, *old])
    assert not old_outranks_window(rank, "Which port?", window, [])


# retrieval_hop.py


def test_leads_are_what_the_best_match_names_and_the_question_does_not() -> None:
    path = path_of("where does nightly-export run?", "nightly-export runs on etl-07 since March")
    texts = lowered_texts(path)
    ranked = [Candidate("n1", 1.0, views=["m"]), Candidate("n0", 0.5, views=["m"])]
    named = leads(
        "where does nightly-export run?", ["nightly-export"], ranked, path, positions_of(path), texts
    )
    assert list(named) == ["etl-07"]
    assert named["etl-07"].node_id == "n1"  # the match that states the question's term, not the one asking


def test_leads_skip_a_capitalised_word_the_path_also_says_in_lower_case() -> None:
    path = path_of("Proposal: move srv-9 to the new rack", "the proposal was accepted", "what about it")
    texts = lowered_texts(path)
    ranked = [Candidate("n0", 1.0, views=["k"])]
    named = leads("what about the rack?", [], ranked, path, positions_of(path), texts)
    assert "proposal" not in named and "srv-9" in named
    assert len(named) <= HOP_TERMS


def test_leads_skip_a_word_capitalised_only_where_sentences_start_and_keep_a_name_said_inside_one() -> None:
    path = path_of(
        "Pulled the logs for srv-9. Thinking: Priya owns it.",
        "- Thinking about srv-9 again",
        "thanks Priya, noted",
        "what about it",
    )
    texts = lowered_texts(path)
    ranked = [Candidate("n0", 1.0, views=["k"])]
    named = leads("who looks after the box?", [], ranked, path, positions_of(path), texts)
    assert "pulled" not in named and "thinking" not in named
    assert {"srv-9", "priya"} <= named.keys()
    assert capitalised_inside("ask Wang Fang first", "wang fang")
    assert not capitalised_inside("Done.\n\n* Done again", "done")


def test_a_chinese_source_leads_by_a_phrase_a_few_other_messages_hold() -> None:
    """ "ff_tax_preview 后面藏着发票合并" names its link in words: "发票合并", held by the source and one other
    message, is the lead; stretches only the source holds, or the question's own, are not."""
    path = path_of(
        "ff_tax_preview 背后的功能是谁做的？",
        "发票合并藏在 ff_tax_preview 后面。",
        "发票合并是 Bogdan 的活。",
        "退款向导藏在 ff_usage_alerts 后面。",
        roles=("assistant",),  # statements: no user's turn whose answer comes with it
    )
    texts = lowered_texts(path)
    ranked = [Candidate("n1", 1.0, views=["m"])]
    asked = "ff_tax_preview 背后的功能是谁做的？"
    named = leads(asked, ["ff_tax_preview"], ranked, path, positions_of(path), texts)
    assert list(named) == ["发票合并"] and named["发票合并"].node_id == "n1"
    dates: dict[str, datetime | None] = {}
    hits = [IndexHit("n2", "c", "m", 2, DAY, 1.0), IndexHit("n3", "c", "m", 3, DAY, 0.5)]
    follow(hits, named, ranked, path, positions_of(path), set(), texts, dates)
    assert [c.node_id for c in ranked] == ["n1", "n2"]  # joined without spaces, found all the same


def test_an_english_source_beside_the_question_term_leads_by_two_words_a_few_other_messages_hold() -> None:
    """ "The invoice merge is behind ff_async_export" names its link in plain words: "invoice merge", held
    by the source and the one message saying whose work it is, leads there."""
    path = path_of(
        "Who built the feature behind ff_async_export?",
        "The invoice merge is behind ff_async_export.",
        "The invoice merge is Ines's work.",
        "The tenant switcher is behind ff_refund_wizard.",
        "We merge invoices nightly, the invoice run is slow.",
        roles=("assistant",),
    )
    texts = lowered_texts(path)
    ranked = [Candidate("n1", 1.0, views=["m"])]
    asked = "who built the feature behind ff_async_export?"
    named = leads(asked, ["ff_async_export"], ranked, path, positions_of(path), texts)
    assert list(named) == ["invoice merge"] and named["invoice merge"].node_id == "n1"
    hits = [IndexHit("n2", "c", "m", 2, DAY, 1.0), IndexHit("n4", "c", "m", 4, DAY, 0.5)]
    follow(hits, named, ranked, path, positions_of(path), set(), texts, {})
    assert [c.node_id for c in ranked] == ["n1", "n2"]  # "invoice run" and "merge invoices" hold no pair
    # Without a term of the question to stand beside, two words of a chat are no link.
    alone = [Candidate("n1", 1.0, views=["m"])]
    assert leads(asked, [], alone, path, positions_of(path), texts) == {}


def test_a_latin_word_said_all_over_a_chinese_chat_leads_nowhere_and_a_rare_one_beside_the_term_does() -> (
    None
):
    """In Chinese text every Latin word is a term: "staging" and "runbook", in a template under every
    answer, filled the lead slots before "app-us-01" (blind-zh); a rare plain word ("tidewater") still
    leads from beside the question's term."""
    boilerplate = "也值得在 runbook 里记一笔，先在 staging 试。"
    path = path_of(
        "sync-api 到底跑在哪？",
        f"跑在 app-us-01 上，替代它的是 tidewater，跟 sync-api 无关的 staging 和 runbook 另说。{boilerplate}",
        *(f"{boilerplate} 第 {i} 次" for i in range(HOP_COMMON + 1)),
    )
    texts = lowered_texts(path)
    ranked = [Candidate(f"n{i}", 1.0 - i / 20, views=["k"]) for i in range(len(path))]
    named = leads(
        "sync-api 所在的那台机器的内网 ip 是多少？", ["sync-api"], ranked, path, positions_of(path), texts
    )
    assert {"app-us-01", "tidewater"} <= named.keys()
    assert "staging" not in named and "runbook" not in named


def test_word_pairs_skip_function_words_the_questions_words_punctuation_and_common_or_lone_pairs() -> None:
    texts = ["usage alerts fire", "the usage alerts page", *(["queue depth spikes"] * 9), "tax preview"]
    asked = "who owns the usage dashboard?"
    assert word_pairs("queue depth and the usage alerts, tax preview", asked, texts) == []
    assert word_pairs("the tax, preview of usage alerts", "who?", texts) == ["usage alerts"]
    assert word_pairs("(queue depth) with usage alerts", "who?", [*texts, "(queue depth"]) == ["usage alerts"]


def test_without_terms_a_turn_asking_the_question_again_leads_nowhere_and_statements_lead() -> None:
    """The turn that asked the same question before shares most of its words, but only a statement
    names a link: "pg-archive", not the "search-edge" asked about beside it."""
    path = path_of(
        "Where did we land on search-edge caching? Also, which Postgres version runs the database that "
        "holds documents?",
        "pg-archive runs Postgres 16.2.",
        "The documents table is in pg-archive.",
    )
    texts = lowered_texts(path)
    ranked = [Candidate("n0", 1.0, views=["k"]), Candidate("n1", 0.5, views=["k"])]
    asked = "which postgres version runs the database that holds documents?"
    named = leads(asked, [], ranked, path, positions_of(path), texts)
    assert list(named) == ["pg-archive"] and named["pg-archive"].node_id == "n1"


def test_no_leads_from_candidates_only_a_neighbour_ranked() -> None:
    path = path_of("etl-07 is the host", "ok")
    texts = {"n0": "etl-07 is the host", "n1": "ok"}
    assert leads("which host?", [], [Candidate("n0", 1.0)], path, positions_of(path), texts) == {}


def test_follow_ranks_a_hit_below_the_match_that_named_it_and_skips_partial_recent_and_joined_hits() -> None:
    path = path_of(
        "nightly-export runs on etl-07",
        "etl-07 was moved to rack 4",
        "etl is great",
        "etl-07 again",
        "etl-07 rebooted",
    )
    positions = positions_of(path)
    source = Candidate("n0", 1.0, views=["m"])
    ranked = [source]
    texts = {"n0": "nightly-export runs on etl-07"}
    dates: dict[str, datetime | None] = {}

    def hit(node_id: str, view: str = "m") -> IndexHit:
        return IndexHit(node_id, "c", view, 0, DAY, 1.0)

    follow(
        [hit("n4", "w"), hit("n2"), hit("n1"), hit("n3"), hit("n0")],  # n4 with its neighbours only
        {"etl-07": source},
        ranked,
        path,
        positions,
        {"n3"},
        texts,
        dates,
    )
    assert [c.node_id for c in ranked] == ["n0", "n1"]
    assert ranked[1].score == pytest.approx(HOP_SHARE * 1.0)  # the first hit that holds the lead
    assert ranked[1].views == ["m"] and dates == {"n1": DAY}
    assert texts["n2"] == "etl is great"  # read once, kept for later checks
    assert source.score == 1.0  # "moved to rack 4" says nothing of what was asked: no confirmation


def test_a_user_turn_found_by_the_best_lead_brings_the_answer_after_it() -> None:
    """ "gridcast inserts row by row, so slow" holds the lead but not the batch size asked about: the
    assistant's turn after it, which states it, ranks as the find does. An assistant's find, a find that
    says what was asked, or one of a lesser lead brings nothing."""
    path = path_of(
        "gridcast was split out of edge-agent last month",
        "Noted.",
        "gridcast is painfully slow on inserts",
        "Write in chunks: BATCH_SIZE = 2000 keeps memory flat.",
        "pg-main is slow as well",
        "Vacuumed it.",
    )
    positions = positions_of(path)
    source = Candidate("n0", 1.0, views=["m"])
    ranked = [source]
    texts = {"n0": "gridcast was split out of edge-agent last month"}
    asked = "how many rows per batch does the service split out of edge-agent write?"
    hits = [IndexHit(node_id, "c", "m", 0, DAY, 1.0) for node_id in ("n2", "n4")]
    follow(
        hits,
        {"gridcast": source, "pg-main": source},
        ranked,
        path,
        positions,
        set(),
        texts,
        {},
        Asked(topic(asked, ("edge-agent",)), ("edge-agent",), asked_kinds(asked)),
    )
    by_id = {c.node_id: c.score for c in ranked}
    assert by_id["n3"] == pytest.approx(by_id["n2"]) == pytest.approx(HOP_SHARE)
    assert "n5" not in by_id  # the answer after a lesser lead's find
    assert next(c for c in ranked if c.node_id == "n3").created_at == DAY  # its question's exchange
    # Where the answer is in the window, it is not ranked again.
    ranked = [Candidate("n0", 1.0, views=["m"])]
    follow(hits[:1], {"gridcast": ranked[0]}, ranked, path, positions, {"n3"}, texts, {})
    assert [c.node_id for c in ranked] == ["n0", "n2"]


def test_a_hit_that_says_what_was_asked_confirms_the_link_and_lifts_its_source() -> None:
    path = path_of("tally-api keeps its state in pg-main", "pg-main restarted", "Disk on pg-main hit 96%")
    source = Candidate("n0", 1.0, views=["m"])
    ranked = [source]
    texts = {"n0": "tally-api keeps its state in pg-main"}
    hits = [IndexHit(node_id, "c", "m", 0, DAY, 1.0) for node_id in ("n1", "n2")]
    asked = "how full was the disk of the database tally-api writes to?"
    words = topic(asked, ("tally-api",))
    follow(hits, {"pg-main": source}, ranked, path, positions_of(path), set(), texts, {}, Asked(words, ()))
    # The find that says "disk" goes first among the finds, though the keyword ranking put it second.
    assert [(c.node_id, c.score) for c in ranked[1:]] == [
        ("n2", pytest.approx(HOP_SHARE)),
        ("n1", pytest.approx(HOP_SHARE * (1 + HOP_SHARE) / 2)),  # below its source, confirmed by then
    ]
    assert source.score == pytest.approx(1.0 + HOP_SHARE)  # once, for the hit that says "disk"


def test_a_find_saying_what_was_asked_beside_its_lead_comes_first_and_a_question_about_it_last() -> None:
    """ "code" in "error codes" is what was asked, but away from otp-sender: that turn comes after the
    statement saying it beside the lead, though the keyword ranking put it first, and still confirms
    the source; a turn only asking about the lead states nothing and comes after a bare statement."""
    path = path_of(
        "Requests to /v1/tenants/:id end up in otp-sender.",
        "We skipped the error codes last time. Does the changelog hit otp-sender?",
        "Does otp-sender need a cursor?",
        "The code of otp-sender is in git/billing-edge.",
        "otp-sender restarted at noon.",
        roles=("assistant",),
    )
    source = Candidate("n0", 1.0, views=["m"])
    ranked = [source]
    texts = lowered_texts(path)
    hits = [IndexHit(node_id, "c", "m", 0, DAY, 1.0) for node_id in ("n1", "n2", "n4", "n3")]
    words = topic("which repository holds the code behind /v1/tenants/:id?", ("v1/tenants/:id",))
    follow(hits, {"otp-sender": source}, ranked, path, positions_of(path), set(), texts, {}, Asked(words, ()))
    assert [(c.node_id, c.score) for c in ranked] == [
        ("n0", pytest.approx(1.0 + HOP_SHARE)),  # confirmed once, by its best find
        ("n3", pytest.approx(HOP_SHARE)),
        ("n1", pytest.approx(HOP_SHARE * (1 + HOP_SHARE) / 2)),
        ("n4", pytest.approx(HOP_SHARE * (1 + HOP_SHARE) / 3)),
        ("n2", pytest.approx(HOP_SHARE * (1 + HOP_SHARE) / 4)),
    ]


def test_the_kind_of_value_asked_for_is_read_from_the_question_and_found_in_texts() -> None:
    kinds = asked_kinds("what's the private ip of the box forecast-trainer runs on?")
    assert holds_kind("10.26.100.171\tml-us-02", kinds) and not holds_kind("ml-us-02 is ancient", kinds)
    assert holds_kind("memory: 1536mi", asked_kinds("生产上最多能用多少内存？"))
    assert holds_kind('schedule: "45 */5 * * *"', asked_kinds("what's the cron expression for batch-gate?"))
    assert holds_kind("ports:\n  - port: 8023", asked_kinds("which port does sprout-sync listen on?"))
    assert not holds_kind("listening since 2023", asked_kinds("which port does sprout-sync listen on?"))
    assert asked_kinds("who built the feature behind ff_async_export?") == ()


def test_a_find_holding_a_value_of_the_kind_asked_for_says_what_was_asked() -> None:
    """A hosts file shares no word with "the private IP of the box", but gives the box's address: it comes
    before a later find that names the box and says nothing of it, and confirms its source."""
    asked = "what's the private ip of the box forecast-trainer runs on?"
    path = path_of(
        "ssh'd into ml-us-02 to look at forecast-trainer, the unit file is ancient",
        "dns is flaky so I hardcoded these\n10.26.100.161\tetl-us-09\n10.26.100.171\tml-us-02",
        "ml-us-02 is due for a kernel patch",
    )
    source = Candidate("n0", 1.0, views=["m"])
    ranked = [source]
    hits = [IndexHit(node_id, "c", "m", 0, DAY, 1.0) for node_id in ("n2", "n1")]
    terms = ("forecast-trainer",)
    follow(
        hits, {"ml-us-02": source}, ranked, path, positions_of(path), set(), lowered_texts(path), {},
        Asked(topic(asked, terms), terms, asked_kinds(asked)),
    )  # fmt: skip
    assert [c.node_id for c in ranked] == ["n0", "n1", "n2"]
    assert source.score == pytest.approx(1.0 + HOP_SHARE)


def test_a_url_parameter_s_value_beside_the_question_term_is_no_lead() -> None:
    """The same example cursor in every answer about pagination is held by many messages, and beside the
    endpoint asked about: a value, not a thing the chat talks about; the service named there still leads."""
    example = "GET /v1/payouts?limit=100&after=eyJpZCI6IDQyfQ"
    path = path_of(
        f"A cursor pays off when clients page deep.\n{example}",
        "/v1/payouts is served by courier.",
        *(f"Offset is fine here.\nGET /v1/refunds?after=eyJpZCI6IDQyfQ&n={i}" for i in range(8)),
    )
    texts = lowered_texts(path)
    ranked = [Candidate(f"n{i}", 1.0 - i / 20, views=["k"]) for i in range(len(path))]
    named = leads(
        "which repository holds the code behind /v1/payouts?",
        ["v1/payouts"],
        ranked,
        path,
        positions_of(path),
        texts,
    )
    assert "eyjpzci6idqyfq" not in named and "courier" not in named  # a plain word: no identifier
    assert query_value(example, "eyjpzci6idqyfq") and not query_value(
        "the cursor eyJpZCI6IDQyfQ", "eyjpzci6idqyfq"
    )


def test_leads_are_read_beside_the_question_term_and_a_short_statement_leads_first() -> None:
    """A DDL line names the table beside six columns; a short statement names it beside its database: the
    database is the first lead, the columns share the weight of their line, and an identifier that holds
    the table's name ("ix_refunds_status") or a line without it leads nowhere."""
    asked = "which postgres version runs the database that holds refunds?"
    path = path_of(
        "create table refunds (id, tenant_id, amount_minor, status, created_at, deleted_at)\n"
        "create index ix_refunds_status on refunds (status)\nalso pg-archive is old",
        "refunds lives in pg-main.",
    )
    texts = lowered_texts(path)
    ranked = [Candidate("n0", 1.0, views=["k"]), Candidate("n1", 0.5, views=["k"])]
    named = leads(asked, ["refunds"], ranked, path, positions_of(path), texts)
    assert next(iter(named)) == "pg-main" and named["pg-main"].node_id == "n1"
    assert "ix_refunds_status" not in named and "pg-archive" not in named


def test_the_answer_to_a_turn_naming_the_question_term_leads_by_its_first_statement() -> None:
    """The assistant's answer to a user's turn about the term states the link without repeating it
    ("replaced by batch-gate"), or first and apart from the sentence naming it ("Exactly one writer:
    tally-svc."); a user's turn after an assistant's naming the term is no answer to it."""
    asked = "what's the cron expression for the service that replaced frame-decoder?"
    path = path_of(
        "what's the status of frame-decoder? still in the deploy list",
        "Per the migration notes it's been replaced by batch-gate; kept only for rollback.\n\n"
        "Watch `http_requests_total` after the change.",
        "frame-decoder's cron runs every 5 min.",
        "ok, noted: see INC-7 and lb-eu-2",
        roles=("user", "assistant", "assistant", "user"),
    )
    texts = lowered_texts(path)
    ranked = [Candidate(f"n{i}", 1.0 - i / 10, views=["k"]) for i in range(4)]
    named = leads(asked, ["frame-decoder"], ranked, path, positions_of(path), texts)
    assert next(iter(named)) == "batch-gate" and named["batch-gate"].node_id == "n1"
    assert "inc-7" not in named and "http_requests_total" not in named
    asked = "what's the cron expression for the job that loads sensor_readings?"
    path = path_of(
        "who writes to sensor_readings?",
        "Exactly one writer: tally-svc. It runs a `COPY sensor_readings (tenant_id, ts) FROM STDIN`.",
    )
    texts = lowered_texts(path)
    ranked = [Candidate("n1", 1.0, views=["k"]), Candidate("n0", 0.5, views=["k"])]
    named = leads(asked, ["sensor_readings"], ranked, path, positions_of(path), texts)
    assert next(iter(named)) == "tally-svc"
    # A turn asking two things is answered on either: its answer is read as any other match.
    path = path_of(
        "Is sensor_readings partitioned? Also, which page size does /v1/prices use?",
        "Comparing the drafts: v1/prices pages by 50.",
        "sensor_readings is partitioned by day on pg-main.",
    )
    texts = lowered_texts(path)
    ranked = [Candidate(f"n{i}", 1.0 - i / 10, views=["k"]) for i in (1, 2, 0)]
    assert list(leads(asked, ["sensor_readings"], ranked, path, positions_of(path), texts)) == ["pg-main"]
    assert not replies_about(Candidate("elsewhere"), path, positions_of(path), ["sensor_readings"])


def test_an_identifier_said_everywhere_still_leads_from_beside_the_question_term() -> None:
    path = path_of("Root cause of INC-4666: shipment-svc.", *(f"shipment-svc deploy {i}" for i in range(9)))
    texts = lowered_texts(path)
    ranked = [Candidate(f"n{i}", 1.0 - i / 10, views=["k"]) for i in range(10)]
    named = leads("who is on call for inc-4666?", ["inc-4666"], ranked, path, positions_of(path), texts)
    assert "shipment-svc" in named


# retrieval_groups.py


def test_a_hit_brings_its_neighbours_and_never_what_the_window_holds() -> None:
    path = path_of(*(f"message {i}" for i in range(10)))
    groups = groups_of(
        path, positions_of(path), [Candidate("n5", 1.0)], {6}, 1_000, {}, 2, 2, 0, "", one_token
    )
    assert [(g.start, g.end) for g in groups] == [(3, 5)]  # stops before the window's message 6
    assert groups[0].tokens == 3 + SEPARATOR_TOKENS - 1


def test_a_tool_result_comes_with_its_call() -> None:
    path = path_of("q", "call", "result", "answer", roles=("user", "assistant", "tool", "assistant"))
    groups = groups_of(
        path, positions_of(path), [Candidate("n2", 1.0)], set(), 1_000, {}, 0, 0, 0, "", one_token
    )
    assert [(g.start, g.end) for g in groups] == [(1, 2)]


def test_past_the_best_grouped_hits_a_hit_comes_alone_and_a_tool_result_still_with_its_call() -> None:
    path = path_of(*(f"message {i}" for i in range(20)))
    ranked = [Candidate(f"n{i}", 1.0 / (i + 1)) for i in (3, 9, 15)]
    groups = groups_of(path, positions_of(path), ranked, set(), 1_000, {}, 1, 1, 0, "", one_token, grouped=2)
    assert [(g.start, g.end) for g in groups] == [(2, 4), (8, 10), (15, 15)]
    every = groups_of(path, positions_of(path), ranked, set(), 1_000, {}, 1, 1, 0, "", one_token)
    assert [(g.start, g.end) for g in every] == [(2, 4), (8, 10), (14, 16)]
    tools = path_of("q", "call", "result", "answer", roles=("user", "assistant", "tool", "assistant"))
    alone = groups_of(
        tools,
        positions_of(tools),
        [Candidate("n2", 1.0)],
        set(),
        1_000,
        {},
        1,
        1,
        0,
        "",
        one_token,
        grouped=0,
    )
    assert [(g.start, g.end) for g in alone] == [(1, 2)]


def test_groups_never_overlap_and_the_allowance_is_kept() -> None:
    path = path_of(*(f"message {i}" for i in range(20)))
    ranked = [Candidate(f"n{i}", 1.0 / (i + 1)) for i in (4, 5, 12, 18)]
    groups = groups_of(path, positions_of(path), ranked, set(), 40, {}, 1, 1, 0, "", one_token)
    shown = [i for g in groups for i in range(g.start, g.end + 1)]
    assert len(shown) == len(set(shown))
    assert sum(g.tokens for g in groups) + DATE_LINE_TOKENS * len({g.created_at for g in groups}) <= 40


def test_a_group_is_labelled_by_the_first_of_its_messages_with_a_known_date() -> None:
    path = path_of("a", "b", "c")
    dates: dict[str, datetime | None] = {"n1": DAY, "n2": DAY + timedelta(days=1)}
    groups = groups_of(
        path, positions_of(path), [Candidate("n1", 1.0, DAY)], set(), 1_000, dates, 1, 1, 0, "", one_token
    )
    assert groups[0].created_at == DAY
    # The next message is from another day: a date line before it, counted in the group's tokens.
    assert [line for line, node in groups[0].lines if node is None] == ["[2024-05-09 13:56]"]
    assert groups[0].tokens == 3 + SEPARATOR_TOKENS - 1 + DATE_LINE_TOKENS


def test_what_the_summary_already_says_is_not_retrieved() -> None:
    assert said_above(
        {"role": "user", "content": "We moved etl-07 to rack-4"}, "summary: etl-07 now in rack-4"
    )
    assert not said_above({"role": "user", "content": "etl-07 crashed"}, "summary: rack-4")
    path = path_of("We moved etl-07 to rack-4", "fine")
    above = "summary: etl-07 now in rack-4"
    ranked = [Candidate("n0", 1.0)]
    assert groups_of(path, positions_of(path), ranked, set(), 1_000, {}, 0, 0, 0, above, one_token) == []


def test_an_other_conversations_group_holds_all_its_messages_and_a_date_line() -> None:
    items = path_of("before", "the match")
    group = other_group(items, Candidate("n1", 0.5, DAY), "c2", 7)
    assert (group.start, group.end, group.label) == (0, 1, "c2")
    assert group.tokens == 7 + DATE_LINE_TOKENS + SEPARATOR_TOKENS
    assert [node for _, node in group.lines] == ["n0", "n1"]


# retrieval_compose.py


def test_groups_are_shown_oldest_first_one_date_line_a_day_and_an_ellipsis_between_gaps() -> None:
    path = path_of(*(f"m{i}" for i in range(10)))

    def group(start: int, end: int, when: datetime | None) -> Group:
        made = Group(start, end, 1.0, when)
        made.lines = lines_of(path, start, end)
        return made

    other = group(0, 0, DAY)
    text, tokens = compose(
        [group(6, 6, DAY + timedelta(days=1)), group(3, 3, DAY), group(0, 1, DAY)],
        [other],
        lambda line, node_id: len(line) + 1,
        len,
    )
    assert text == "\n".join(
        [
            HEADER,
            "",
            "[2024-05-08 13:56]",
            "user: m0",
            "assistant: m1",
            "…",
            "assistant: m3",
            "",
            "[2024-05-09 13:56]",
            "user: m6",
            "",
            OTHER_HEADER,
            "",
            "[2024-05-08 13:56]",
            "user: m0",
        ]
    )
    assert tokens == len(text)  # every line and break counted once


def test_nothing_to_show_is_no_text() -> None:
    assert compose([], [], lambda line, node_id: 1, len) == (None, 0)


def test_leads_reach_a_link_stated_below_many_messages_that_name_the_question_term() -> None:
    """A service said in every other turn: the one statement of where it writes ranked 12th among the
    messages naming it, and is still read for the lead."""
    chatter = [f"recon-batch restarted at 10:{minute:02d}, all green" for minute in range(11)]
    path = path_of(*chatter, "recon-batch keeps all its state in pg-tenants.", "Disk on pg-tenants hit 90%")
    texts = lowered_texts(path)
    ranked = [Candidate(f"n{i}", 1.0 - i / 100, views=["m"]) for i in range(12)]
    asked = "how full was the disk of the database recon-batch writes to?"
    named = leads(asked, ["recon-batch"], ranked, path, positions_of(path), texts)
    assert named.keys() == {"pg-tenants"} and named["pg-tenants"].node_id == "n11"


def test_a_word_capitalised_where_a_sentence_starts_does_not_halve_the_link_beside_it() -> None:
    """ "Confirmed that webhook-relay's consumer group reads doc.jobs." names one link: "Confirmed" is no
    name, so doc.jobs weighs as much as any single lead and, its source sharing the question's topic,
    goes first."""
    path = path_of(
        *(f"webhook-relay moved to node-{i}a" for i in range(HOP_TERMS)),
        "Confirmed that webhook-relay's consumer group reads doc.jobs.",
        "confirmed, thanks",
    )
    texts = lowered_texts(path)
    ranked = [Candidate(f"n{i}", 1.0 - i / 100, views=["m"]) for i in range(HOP_TERMS + 1)]
    asked = "how many partitions does the topic webhook-relay consumes from have?"
    named = leads(asked, ["webhook-relay"], ranked, path, positions_of(path), texts)
    assert next(iter(named)) == "doc.jobs" and "confirmed" not in named


class RecordingSearch:
    """A keyword index holding each lead's hits (the hop's port, `KeywordSearch`), recording its queries."""

    def __init__(self, hits: dict[str, list[IndexHit]]) -> None:
        self.hits, self.queries = hits, list[str]()

    async def search(self, query: SearchQuery) -> SearchResult:
        self.queries.append(query.text)
        return SearchResult([], self.hits.get(query.text, [])[: query.limit])


def test_each_lead_is_searched_alone_so_a_common_one_does_not_crowd_out_the_others() -> None:
    path = path_of(
        "price-cache consumes from email-outbound, deployed in us-west-2.",
        *(f"us-west-2 check {i} ok" for i in range(60)),
        "email-outbound has 8 partitions, which caps consumers at 8.",
        roles=("assistant",),
    )
    positions = positions_of(path)
    texts = lowered_texts(path)
    ranked = [Candidate("n0", 1.0, views=["m"])]
    answer = f"n{len(path) - 1}"
    index = RecordingSearch(
        {
            "email-outbound": [IndexHit(answer, "c", "m", len(path) - 1, DAY, 1.0)],
            "us-west-2": [IndexHit(f"n{i}", "c", "m", i, DAY, 1.0) for i in range(1, 61)],
        }
    )
    query = SearchQuery(
        "acme", "How many partitions does the topic price-cache consumes from have?", None, 40, "c"
    )
    searched, confirmed = asyncio.run(
        second_hop(index, query, ["price-cache"], {}, ranked, path, positions, set(), texts)
    )
    assert confirmed == 1  # the find saying "partitions" confirms the source
    assert sorted(index.queries) == sorted(searched) == ["email-outbound", "us-west-2"]
    # The statement that says "partitions" ranks first among the finds, right below its source.
    assert [c.node_id for c in ranked[:2]] == ["n0", answer]
