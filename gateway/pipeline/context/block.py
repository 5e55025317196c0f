"""The injected blocks' framing: the delimited system messages that hold the sections' texts (the stable
block after the client's system prompt, the volatile tail before the question), and their exact counts."""

from __future__ import annotations

from gateway.pipeline.context.section import Proposal
from gateway.ports import JSONObject, Tokenizer

INJECTED_HEADER = "The gateway added the following context from earlier in this conversation and from memory."
TAIL_HEADER = "The gateway added the following context for the next message only."

_BETWEEN = "\n\n"
_CLOSING = "\n</gateway_context>"


def _opening(header: str) -> str:
    return f"<gateway_context>\n{header}\n\n"


def injected_block(texts: list[str], header: str = INJECTED_HEADER) -> JSONObject | None:
    """Sections' texts in one delimited system message, so the model can tell memory from instructions."""
    if not texts:
        return None
    return {"role": "system", "content": f"{_opening(header)}{_BETWEEN.join(texts)}{_CLOSING}"}


def block_tokens(proposals: list[Proposal], tokenizer: Tokenizer, header: str = INJECTED_HEADER) -> int:
    """The block's exact count, from the sections' own counts (only the text around each join is counted
    again: counted whole, retrieved lines went through the tokenizer's line cache once more)."""
    if not proposals:
        return 0
    parts: list[tuple[str, int | None]] = [(_opening(header), None)]
    for number, proposal in enumerate(proposals):
        if number:
            parts.append((_BETWEEN, None))
        parts.append((proposal.text or "", proposal.tokens))
    parts.append((_CLOSING, None))
    return tokenizer.count_message({"role": "system", "content": ""}) + tokenizer.count_concat(parts)


def framing_tokens(tokenizer: Tokenizer, sections: int, header: str = INJECTED_HEADER) -> int:
    """Tokens of a block around its sections' texts: header, delimiters, message overhead, a separator
    per section."""
    empty = injected_block([""], header)
    return (tokenizer.count_message(empty) if empty is not None else 0) + sections
