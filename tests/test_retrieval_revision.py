"""The newest decisions on a question's topic go first for a question about where something stands now,
and the newest reports that something was done for a question asking when (`retrieval_revision.py`), in
English and in Chinese."""

from __future__ import annotations

from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.question import exact_terms, kebab_names, topic
from gateway.pipeline.context.ranking import Candidate
from gateway.pipeline.context.retrieval_revision import COMPLETION, promote_statements, without_people


def test_the_topic_is_the_question_without_its_names_and_its_asking() -> None:
    question = "What is the current deploy strategy for webhook-relay?"
    assert topic(question, exact_terms(question)) == {"depl", "stra"}
    chinese = "/v1/documents/:id 的分页方式最后定的是什么？"
    assert topic(chinese, exact_terms(chinese)) == {"分页", "页方", "方式"}
    assert topic("What did we end up with?", ()) == frozenset()


def path_of(texts: list[str]) -> list[HistoryItem]:
    return [HistoryItem({"role": "user", "content": t}, 5, f"n{i}") for i, t in enumerate(texts)]


def lowered(item: HistoryItem) -> str:
    return str(item.message["content"]).lower()


def promoted_for(question: str, texts: list[str], recent: set[str | None]) -> list[str]:
    """The decisions promoted for `question` over a path of `texts`, nothing ranked before."""
    terms = exact_terms(question)
    return promote_statements([], topic(question, terms), terms, path_of(texts), recent, lowered)


def test_the_newest_decisions_on_the_topic_go_first_even_when_no_search_found_them() -> None:
    path = path_of(
        [
            "Proposal for webhook-relay: a blue-green deploy strategy.",  # n0: names it, no decision
            "We decided on blue-green deploys for webhook-relay.",  # n1: the first decision
            "The retry policy is settled: five retries.",  # n2: a decision on another topic
            "Summary of where the deploy thing landed: a canary at 25%.",  # n3: the newest, loose
            "Unrelated: the disk is 80% full.",  # n4
            "Final call on the deploys: canary, agreed.",  # n5: in the recent window
        ]
    )
    ranked = [Candidate("n0", 0.9), Candidate("n1", 0.5), Candidate("n4", 0.1)]
    question = "What is the current deploy strategy for webhook-relay?"
    words = topic(question, exact_terms(question))
    promoted = promote_statements(ranked, words, exact_terms(question), path, {"n5"}, lowered)
    # The decision naming the service, then the newest on the topic; n5 is in the window already.
    assert promoted == ["n1", "n3"]
    assert [c.node_id for c in ranked] == ["n1", "n3", "n0", "n4"]


def test_chinese_decisions_are_found_by_the_questions_bigrams() -> None:
    path = path_of(
        [
            "/v1/documents/:id 的分页方式先用 offset。",
            "分页的问题最终结论：不透明游标。我去更新文档。",
            "删除的问题最后还是定了挪到归档表。",
        ]
    )
    ranked: list[Candidate] = []
    question = "/v1/documents/:id 的分页方式最后定的是什么？"
    terms = exact_terms(question)
    promoted = promote_statements(ranked, topic(question, terms), terms, path, set(), lowered)
    assert promoted == ["n1"]  # the deletion decision shares no topic word
    assert [c.node_id for c in ranked] == ["n1"]


def test_a_loose_decision_is_tied_to_the_service_by_the_person_who_revised_it() -> None:
    """The newest loose decision is another service's; the one approved by Sara, who asked for this
    service's revision, goes before it."""
    texts = [
        "After Sara's review, the fx-rates versioning plan changed to dated versions.",  # n0
        "Sara approved: the versioning discussion ends with an Accept-Version header.",  # n1
        "Bogdan approved: otp-sender's versioning is final, dated versions.",  # n2
        "Unrelated chatter about lunch.",  # n3
    ]
    assert promoted_for("What is the final versioning plan for fx-rates?", texts, {"n3"}) == ["n0", "n1"]


def test_nothing_moves_without_a_topic_or_a_decision() -> None:
    path = path_of(["We talked about the deploy strategy at length.", "Deploys are slow on Fridays."])
    ranked = [Candidate("n1", 0.4)]
    assert promote_statements(ranked, frozenset({"depl"}), (), path, set(), lowered) == []
    assert promote_statements(ranked, frozenset(), (), path, set(), lowered) == []
    assert [(c.node_id, c.score) for c in ranked] == [("n1", 0.4)]


def test_a_decision_naming_another_service_goes_after_a_loose_one() -> None:
    """The newest decision on the topic is another service's; the loose one before it ("the deploy
    thing") is this one's, as far as words tell, and a channel it routes to names no service."""
    texts = [
        "Proposal for webhook-relay: a blue-green deploy strategy.",  # n0
        "Summary of where the deploy thing landed: a canary at 25%, posted to #ops-alerts.",  # n1
        "Decided: otp-sender's deploy strategy is rolling, maxSurge 1.",  # n2: another service's
        "Unrelated chatter about lunch.",  # n3
    ]
    assert promoted_for("What is the current deploy strategy for webhook-relay?", texts, set()) == [
        "n1",
        "n2",
    ]


def test_chinese_decisions_said_as_settled_at_last_or_agreed() -> None:
    texts = [
        "好，积压的问题最后定的是按租户拆 topic，这次是真的。",  # n0
        "积压那件事，我和 Ines 商量好了，先加两个消费者，就这么上线。",  # n1
        "积压又涨了，大家怎么看？",  # n2: no decision
    ]
    assert promoted_for("search-edge 现在的积压的解决办法是什么？", texts, set()) == ["n1", "n0"]


def test_kebab_names_leave_channels_out() -> None:
    assert kebab_names("ledger-api posts to #ops-alerts, see the wiki#") == {"ledger-api"}


def test_a_decision_said_in_any_form_of_its_idiom_is_one() -> None:
    """ "Landing on", "went with", "sticking with": the same idioms as "landed", "go with" (a loose final
    revision was missed for its "-ing"); a plan to pick a window or a landing page decides nothing."""
    question = "What did we finally settle on for the wire format of backfill-runner?"
    texts = [
        "Talked to Dmitri again about the format... landing on protobuf. For real this time.",  # n0
        "We went with JSON for the format at first.",  # n1
        "Let's pick a window for the format migration.",  # n2: not a decision
        "The landing page format is fine.",  # n3: not a decision
    ]
    assert sorted(promoted_for(question, texts, set())) == ["n0", "n1"]


def reported_for(question: str, texts: list[str]) -> list[str]:
    """The reports of something done promoted for `question` over a path of `texts`."""
    terms = exact_terms(question)
    words = without_people(topic(question, tuple(t for t in terms if not t.isalpha())), question)
    return promote_statements([], words, terms, path_of(texts), set(), lowered, COMPLETION)


def test_a_loose_report_that_it_was_done_answers_when_it_was() -> None:
    """The plan names the service; the report that it shipped names only the thing done, loosely. A plan,
    a question, a postponement and another service's report are no answer."""
    texts = [
        "plan for next week: cut DNS for plan-api over to the new load balancer. Nadia can help",  # n0
        "is the DNS cutover done?",  # n1: asked
        "the DNS cutover isn't happening this week, staging is broken",  # n2: not done
        "the DNS cutover: shipped. Nadia watched the graphs with me, nothing weird",  # n3
        "we just did it: cut DNS for sync-api over to the new load balancer. took 20 min",  # n4: another's
        "the arm64 move: shipped, zero errors",  # n5: another topic
        "we just did it: bump plan-api to Go 1.21. took 20 min",  # n6: another thing done to plan-api
    ]
    assert reported_for(
        "When did we actually cut DNS for plan-api over to the new load balancer?", texts
    ) == ["n3"]


def test_a_chinese_report_that_it_was_done_is_found_by_its_words() -> None:
    texts = [
        "周四能不能把 sync-api 的 DNS 切到新负载均衡？",  # n0: asked
        "DNS 切换还没做完，压测没过",  # n1: not yet
        "DNS 切换：已完成。Bogdan和我一起盯了监控，没啥异常",  # n2
    ]
    assert reported_for("我们实际是哪天把 sync-api 的 DNS 切到新负载均衡的？", texts) == ["n2"]


def test_the_people_a_when_question_names_share_nothing_with_what_they_did() -> None:
    """Every turn of Caroline's says her name; what she did is the topic ("LGBTQ" is an acronym, kept)."""
    question = "When did Caroline go to the LGBTQ support group?"
    words = without_people(topic(question, ()), question)
    assert "caro" not in words and {"lgbt", "supp", "grou"} <= words
    texts = [
        "Caroline: I'm done with the painting, finally!",
        "Caroline: the LGBTQ group meetup happened today",
    ]
    assert reported_for(question, texts) == ["n1"]
