"""`context-gateway demo` plays its story end to end: the booking code comes back through retrieval
many turns later, and a new conversation of the same user starts with what memory learnt."""

from __future__ import annotations

import re

from gateway.demo import run_demo


def test_the_demo_shows_retrieval_from_far_back_and_memory_in_a_new_conversation() -> None:
    lines: list[str] = []
    assert run_demo(16, lines.append) == 0
    text = "\n".join(lines)
    first, second = text.split("Conversation 2:", 1)
    recall = first.split("Remind me: what was my booking code?", 1)[1]
    assert "LX-4471" in recall and "## Retrieved from earlier in this conversation" in recall
    sections = recall.splitlines()[1]  # the turn's sections: a summary, retrieval, the newest exchanges
    assert "summary" in sections and "retrieval" in sections, sections
    exchanges = re.search(r"window \d+ \((\d+) exchanges\)", sections)
    assert exchanges is not None and int(exchanges.group(1)) >= 2, sections
    assert "## Conversation so far" in recall and "LX-4471" in recall.split("## Retrieved")[1]
    assert "What the gateway remembers about this user" in second and "vegetarian" in second
    assert "context-gateway context --tenant demo" in text
