"""The retrieval section's text from its groups, and its exact token count. Pure: tokens come in through
`counted` (a message line and its line break, counted once per message) and `count`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date

from gateway.pipeline.context.retrieval_groups import Group
from gateway.pipeline.context.tail_lines import Line, day_of, when

HEADER = "## Retrieved from earlier in this conversation (verbatim, oldest first)"
OTHER_HEADER = "## Retrieved from this user's other conversations (verbatim)"


def compose(
    groups: list[Group],
    others: list[Group],
    counted: Callable[[str, str], int],
    count: Callable[[str], int],
) -> tuple[str | None, int]:
    """The section's text and its tokens: this conversation's groups oldest first under one date line
    per day ("…" between groups that are not adjacent), then the other conversations' groups, each with
    its date. Every line but the first starts with a letter (a role), `[`, `#` or `…`, so the count is
    the sum of its lines' (see `Tokenizer.count`): `counted(line, node_id)` for a message line followed
    by another line, `count` for the rest."""
    blocks = blocks_of(groups, others)
    if not blocks:
        return None, 0
    tokens = 0
    for number, block in enumerate(blocks):
        # Lines are joined by a line break, blocks by a blank line; the text ends with no break.
        last = "" if number == len(blocks) - 1 else "\n\n"
        for at, (line, node_id) in enumerate(block):
            if at < len(block) - 1 and node_id is not None:
                tokens += counted(line, node_id)
            else:
                tokens += count(line + ("\n" if at < len(block) - 1 else last))
    text = "\n\n".join("\n".join(line for line, _ in block) for block in blocks)
    return text, tokens


def blocks_of(groups: list[Group], others: list[Group]) -> list[list[Line]]:
    """The section's blocks of lines: the header, one block per day of this conversation's groups, then
    the other conversations' header and one block per group."""
    blocks: list[list[Line]] = []
    if groups:
        blocks.append([(HEADER, None)])
        day_block: list[Line] = []
        day: date | str | None = "none yet"  # an undated group is a day of its own (None)
        previous: Group | None = None
        for group in sorted(groups, key=lambda g: g.start):
            if day_of(group.created_at) != day:
                if day_block:
                    blocks.append(day_block)
                day = day_of(group.created_at)
                day_block = [(f"[{when(group.created_at)}]", None)]
            elif previous is not None and group.start > previous.end + 1:
                day_block.append(("…", None))
            day_block += group.lines
            previous = group
        blocks.append(day_block)
    if others:
        blocks.append([(OTHER_HEADER, None)])
        blocks += [[(f"[{when(g.created_at)}]", None), *g.lines] for g in others]
    return blocks
