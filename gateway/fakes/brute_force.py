"""What both in-memory indexes score with: brute-force cosine and a small BM25 (no length normalisation)
over tokens read as the real index reads them."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from gateway.text import cjk_terms

_TOKEN = re.compile(r"[^\W_]+")
COMPOUND = re.compile(r"[^\W_]+(?:[._\-/:@#]+[^\W_]+)+")
# A few English stop words, as the real index drops them (it uses the full list).
_STOP_WORDS = frozenset(
    [
        *("a", "an", "and", "are", "as", "at", "be", "but", "by", "did", "do", "for", "from", "had"),
        *("has", "have", "i", "in", "is", "it", "of", "on", "or", "so", "that", "the", "this", "to"),
        *("was", "we", "were", "what", "when", "where", "which", "who", "why", "with", "you"),
    ]
)

R = TypeVar("R")


def tokens(text: str) -> list[str]:
    # CJK runs as bigrams and characters, as the real index reads them.
    return [t for t in _TOKEN.findall(cjk_terms(text).lower()) if t not in _STOP_WORDS]


def unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else list(vector)


def contains(words: list[str], phrase: list[str]) -> bool:
    width = len(phrase)
    return any(words[i : i + width] == phrase for i in range(len(words) - width + 1))


@dataclass(slots=True)
class Held(Generic[R]):
    """A row with what scoring reads of it: its tokens, their counts and its unit vector."""

    row: R
    tokens: list[str]
    counts: Counter[str]
    unit: list[float] | None

    @classmethod
    def of(cls, row: R, text: str, vector: Sequence[float] | None) -> Held[R]:
        words = tokens(text)
        return cls(row, words, Counter(words), unit(vector) if vector is not None else None)


def nearest(vector: Sequence[float], candidates: list[Held[R]], limit: int) -> list[tuple[float, R]]:
    query = unit(vector)
    scored = [(sum(a * b for a, b in zip(query, h.unit, strict=True)), h) for h in candidates if h.unit]
    scored.sort(key=lambda pair: pair[0], reverse=True)
    return [(score, h.row) for score, h in scored[:limit]]


def keyword(text: str, corpus: list[Held[R]], candidates: list[Held[R]], limit: int) -> list[tuple[float, R]]:
    """BM25 of `candidates`, document frequencies over `corpus` (the tenant's rows, roughly what Lance's
    index statistics give); a whole identifier of the query counts again, like the adapter's phrases."""
    terms = list(dict.fromkeys(tokens(text)))
    if not terms:
        return []
    total = len(corpus)
    frequency = {t: sum(1 for h in corpus if t in h.counts) for t in terms}
    weight = {t: math.log(1 + (total - frequency[t] + 0.5) / (frequency[t] + 0.5)) for t in terms}
    phrases = [tokens(chunk) for chunk in dict.fromkeys(COMPOUND.findall(text))]
    scored: list[tuple[float, Held[R]]] = []
    for held in candidates:
        score = sum(held.counts[t] / (held.counts[t] + 1.2) * weight[t] for t in terms if t in held.counts)
        for phrase in phrases:
            if phrase and contains(held.tokens, phrase):
                score += sum(weight.get(t, 0.0) for t in phrase)
        if score > 0:
            scored.append((score, held))
    scored.sort(key=lambda pair: pair[0], reverse=True)
    return [(score, h.row) for score, h in scored[:limit]]
