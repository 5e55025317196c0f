"""A message's readable text: what the summariser reads, the index searches and retrieval shows."""

from __future__ import annotations

import re

from gateway.ports import JSONObject

# Scripts written without spaces between words (Chinese, Japanese) or with particles glued to words
# (Korean), as a regex character-class body.
CJK = "\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_CJK_RUN = re.compile(f"[{CJK}]+")


_CJK_CHAR = re.compile(f"[{CJK}]")
_LATIN = re.compile(r"[A-Za-z]")


def mostly_cjk(text: str) -> bool:
    """Whether `text` is written mostly in Chinese, Japanese or Korean (English identifiers inside it
    included): a CJK character weighs about as much as a three-letter stretch of Latin text."""
    cjk = len(_CJK_CHAR.findall(text))
    return cjk > 0 and cjk * 3 >= len(_LATIN.findall(text))


def cjk_terms(text: str, singles: bool = True) -> str:
    """`text` with every run of CJK characters spelled as its overlapping character bigrams, the classic
    unit for indexing text without spaces ("端口改成" -> "端口 口改 改成"), then (`singles`) its characters
    one by one, so a word written shorter or longer still shares some ("扩容" and "扩缩容" share no
    bigram; with single characters, recall of revised decisions in the Chinese work chats rose 75.0 ->
    86.1 and 77.8 -> 83.3 %, BENCHMARKS.md, issue 28); each set apart by spaces, so a name written
    against it ("对search-edge") stays a word of its own."""

    def spelled(match: re.Match[str]) -> str:
        run = match.group(0)
        if len(run) == 1:
            return f" {run} "
        bigrams = [run[i : i + 2] for i in range(len(run) - 1)]
        return " " + " ".join([*bigrams, *run] if singles else bigrams) + " "

    return _CJK_RUN.sub(spelled, text)


def message_text(message: JSONObject) -> str:
    """Text parts joined (attachments as `<type>`), tool calls as `<tool call name(arguments)>`."""
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(str(part["text"]))
            elif isinstance(part, dict):
                parts.append(f"<{part.get('type', 'attachment')}>")
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                parts.append(f"<tool call {function.get('name')}({function.get('arguments')})>")
    return "\n".join(parts)
