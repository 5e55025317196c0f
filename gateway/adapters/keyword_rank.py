"""Keyword ranking of one conversation in memory: BM25 over the rows the index's conversation cache holds.

A keyword search of one conversation in LanceDB's full-text index cost ~10 ms of CPU per query (3,000
rows, every row matching), plus a scan of every row added since the last compaction; with two per request
(the question, then the second hop) it was a large part of the full pipeline's CPU at 32 connections
(BENCHMARKS.md, "Issue 16"). The index already keeps each searched conversation's rows in memory for its
semantic search (`vector_cache.py`); this module adds their terms, so both rankings of a one-conversation
query are served from there. Queries over a user's or a tenant's rows still go to the table's index.

Terms are made as the table's full-text index makes them (`lance_index.FTS_CONFIG`): runs of letters and
digits (the "simple" tokenizer), lower-cased, tokens of 80 characters or more dropped, accents folded,
English stop words removed, Snowball English stems ("deploying" finds "deploy"). Texts and queries reach
here with their Chinese, Japanese and Korean runs already spelled as bigrams and single characters
(`cjk_terms`).

Ranking: Okapi BM25 (k1 1.2, b 0.75, Lucene's idf) over the conversation's own rows, so one tenant's
texts never weigh in another's ranking. An identifier of the question ("parse_config.py") is also a
phrase: rows holding its terms in order, next to each other, get their scores again (as the table's
index's phrase clause does).

`ViewRanker` ranks a history the index has not written yet the same way, from the texts in hand.
"""

from __future__ import annotations

import math
import re
import threading
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import Stemmer

from gateway.records import message_views
from gateway.text import cjk_terms

K1 = 1.2
B = 0.75
# Texts whose terms `ViewRanker` keeps (a long history in hand is ~2,500 messages; a few MB at most).
ANALYSED_TEXTS = 4_096
MAX_TOKEN_CHARS = 80  # the table's index drops longer tokens (its `max_token_length`)
# The question's first distinct words searched, here and in the table (a pasted log: 3,000 terms took ~7 ms
# there).
MAX_QUERY_TERMS = 256
MAX_PHRASES = 8
_TOKEN = re.compile(r"[^\W_]+")
WORD = re.compile(r"[^\W_]")  # a question without one has nothing to look for
# Identifier-like chunks (parse_config.py, user_profile_cache, 10.0.0.1, src/app.ts): matched also as a
# phrase, so rows holding the whole identifier outrank rows holding its common pieces (here and in the
# table's query, lance_index.keyword_query).
COMPOUND = re.compile(r"[^\W_]+(?:[._\-/:@#]+[^\W_]+)+")
# Snowball's English stop words, as the table's index removes them (those with an apostrophe never reach
# it: the tokenizer splits there).
# fmt: off
STOP_WORDS = frozenset([
    "i", "me", "my", "myself", "we", "our", "ours", "ourselves", "you", "your", "yours", "yourself",
    "yourselves", "he", "him", "his", "himself", "she", "her", "hers", "herself", "it", "its", "itself",
    "they", "them", "their", "theirs", "themselves", "what", "which", "who", "whom", "this", "that",
    "these", "those", "am", "is", "are", "was", "were", "be", "been", "being", "have", "has", "had",
    "having", "do", "does", "did", "doing", "would", "should", "could", "ought", "a", "an", "the", "and",
    "but", "if", "or", "because", "as", "until", "while", "of", "at", "by", "for", "with", "about",
    "against", "between", "into", "through", "during", "before", "after", "above", "below", "to", "from",
    "up", "down", "in", "out", "on", "off", "over", "under", "again", "further", "then", "once", "here",
    "there", "when", "where", "why", "how", "all", "any", "both", "each", "few", "more", "most", "other",
    "some", "such", "no", "nor", "not", "only", "own", "same", "so", "than", "too", "very",
])
# fmt: on
_TERM_CACHE = 200_000  # distinct raw tokens whose term is remembered (then forgotten all at once)
# Lines whose terms `view_terms` remembers (a message's three views are written a few rows apart), and the
# longest line remembered (a pasted log is analysed each time instead of held).
CACHED_LINES = 256
CACHED_LINE_CHARS = 2_000

Ints = npt.NDArray[np.int32]
Floats = npt.NDArray[np.float32]
Terms = tuple[list[str], list[int]]  # a text's terms and their positions
Analysed = tuple[list[str], list[int], "Counter[str]"]  # and how often each is said


@dataclass(slots=True)
class Analyzer:
    """Text to terms. Remembers each raw token's term: a conversation repeats its words."""

    _stemmer: Stemmer.Stemmer = field(default_factory=lambda: Stemmer.Stemmer("english"))
    _terms: dict[str, str | None] = field(default_factory=dict)
    # PyStemmer's stemmers must not be used by two threads at once (rows are read on worker threads).
    _lock: threading.Lock = field(default_factory=threading.Lock)

    _lines: Callable[[str], tuple[list[str], list[int], int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._lines = lru_cache(maxsize=CACHED_LINES)(self._counted)

    def terms(self, text: str) -> Terms:
        """`text`'s terms, each with its position among the text's tokens (a dropped stop word keeps its
        place, as in the table's index: a phrase around it still matches only where it stood)."""
        out, at, _ = self._counted(text)
        return out, at

    def view_terms(self, text: str) -> Terms:
        """`terms` of a view's text, its messages' texts joined by line breaks, each line analysed once:
        a message is in up to three views, and a history sent at once brings ~7,500 rows to the vector
        cache (BENCHMARKS.md, issue 28). No token spans a line break, so the terms are the same."""
        out: list[str] = []
        at: list[int] = []
        offset = 0
        for line in text.split("\n"):
            words, places, count = (
                self._lines(line) if len(line) <= CACHED_LINE_CHARS else self._counted(line)
            )
            out.extend(words)
            at.extend(p + offset for p in places)
            offset += count
        return out, at

    def _counted(self, text: str) -> tuple[list[str], list[int], int]:
        """`terms`, and how many tokens the text has (stop words and overlong ones included)."""
        known = self._terms
        out: list[str] = []
        at: list[int] = []
        tokens = _TOKEN.findall(text.lower())
        for position, token in enumerate(tokens):
            term = known.get(token, "")
            if term == "":
                term = self._term(token)
            if term is not None:
                out.append(term)
                at.append(position)
        return out, at, len(tokens)

    def _term(self, token: str) -> str | None:
        if len(token) >= MAX_TOKEN_CHARS:
            term = None
        else:
            folded = _fold(token)
            if folded in STOP_WORDS:
                term = None
            else:
                with self._lock:
                    term = self._stemmer.stemWord(folded)
        if len(self._terms) >= _TERM_CACHE:
            self._terms.clear()
        self._terms[token] = term
        return term

    def query(self, text: str) -> KeywordQuery | None:
        """The question's terms and identifier phrases (None: no word to look for). `text` is the
        question as asked; its CJK runs are spelled as bigrams and characters here."""
        if not WORD.search(text):
            return None
        terms = list(dict.fromkeys(self.terms(cjk_terms(text))[0]))[:MAX_QUERY_TERMS]
        if not terms:
            return None
        phrases: list[tuple[tuple[str, ...], tuple[int, ...]]] = []
        for phrase in list(dict.fromkeys(COMPOUND.findall(text)))[:MAX_PHRASES]:
            words, at = self.terms(cjk_terms(phrase))
            if words:
                phrases.append((tuple(words), tuple(a - at[0] for a in at)))
        return KeywordQuery(tuple(terms), tuple(phrases))


def _fold(token: str) -> str:
    """Accents off Latin letters ("café" -> "cafe"); other scripts unchanged."""
    if token.isascii():
        return token
    decomposed = unicodedata.normalize("NFKD", token)
    return "".join(c for c in decomposed if not unicodedata.combining(c))


@dataclass(frozen=True, slots=True)
class KeywordQuery:
    terms: tuple[str, ...]
    # Identifiers of the question: their terms and each one's place relative to the first.
    phrases: tuple[tuple[tuple[str, ...], tuple[int, ...]], ...] = ()


_EMPTY_INTS: Ints = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True, slots=True)
class Posting:
    """One term's rows (ascending), its count in each, and its positions there (row after row)."""

    rows: Ints
    counts: Ints
    positions: Ints

    def at(self, rows: Ints) -> list[list[int]]:
        """The term's positions in each of `rows` (each holds it)."""
        ends = np.cumsum(self.counts)
        j = np.searchsorted(self.rows, rows)
        return [self.positions[e - c : e].tolist() for e, c in zip(ends[j], self.counts[j], strict=True)]


@dataclass(frozen=True, slots=True)
class Postings:
    """Each term's posting, and each row's length in terms. Never changed once built (`extended` returns
    a new one): a search may read it while rows are added."""

    lengths: Ints = field(default_factory=lambda: _EMPTY_INTS)
    terms: dict[str, Posting] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def extended(self, docs: Iterable[Terms]) -> Postings:
        """These postings with one more row per item of `docs` (each row's terms), numbered on. Built with
        numpy sorts, not per occurrence in Python: a history sent at once adds ~7,500 rows here on a worker
        thread, and the request path waited for the interpreter meanwhile (BENCHMARKS.md, issue 28)."""
        words: list[str] = []
        places: list[int] = []
        lengths: list[int] = []
        for doc, at in docs:
            if len(doc) != len(at):
                raise ValueError("each term needs its position")
            lengths.append(len(doc))
            words.extend(doc)
            places.extend(at)
        if not lengths:
            return self
        ids: dict[str, int] = {}
        term_ids = np.fromiter((ids.setdefault(w, len(ids)) for w in words), np.int64, len(words))
        row_of = np.repeat(np.arange(self.rows, self.rows + len(lengths), dtype=np.int32), lengths)
        # Stable: within a term, rows stay ascending and each row's positions in their order.
        order = np.argsort(term_ids, kind="stable")
        term_ids, row_of = term_ids[order], row_of[order]
        positions = np.asarray(places, dtype=np.int32)[order]
        new_term = np.ones(len(order), dtype=np.bool_)
        new_term[1:] = term_ids[1:] != term_ids[:-1]
        new_pair = new_term.copy()
        new_pair[1:] |= row_of[1:] != row_of[:-1]
        pair_starts = np.flatnonzero(new_pair)
        pair_rows = row_of[pair_starts]
        pair_counts = np.diff(np.append(pair_starts, len(order))).astype(np.int32)
        term_pairs = np.flatnonzero(new_term[pair_starts])  # each term's first pair
        pair_bounds = np.append(term_pairs, len(pair_starts))
        place_bounds = np.append(pair_starts[term_pairs], len(order))
        merged = dict(self.terms)
        for k, term in enumerate(sorted(ids, key=ids.__getitem__)):
            a, b = pair_bounds[k], pair_bounds[k + 1]
            # Copies, not views: a view would keep the whole batch's arrays alive as long as one term of
            # it is never extended again.
            posting = Posting(
                pair_rows[a:b].copy(),
                pair_counts[a:b].copy(),
                positions[place_bounds[k] : place_bounds[k + 1]].copy(),
            )
            held = merged.get(term)
            if held is not None:
                posting = Posting(
                    np.concatenate([held.rows, posting.rows]),
                    np.concatenate([held.counts, posting.counts]),
                    np.concatenate([held.positions, posting.positions]),
                )
            merged[term] = posting
        return Postings(np.concatenate([self.lengths, np.asarray(lengths, dtype=np.int32)]), merged)

    def scores(self, query: KeywordQuery) -> Floats:
        """Each row's BM25 score for `query` (0 where no term matches)."""
        scores = np.zeros(self.rows, dtype=np.float32)
        if not self.rows:
            return scores
        average = max(float(self.lengths.mean()), 1.0)
        norm = K1 * (1.0 - B + B * self.lengths.astype(np.float32) / average)
        own: dict[str, Floats] = {}

        def weights(term: str, posting: Posting) -> Floats:
            if term not in own:
                held = len(posting.rows)
                idf = math.log(1.0 + (self.rows - held + 0.5) / (held + 0.5))
                counts = posting.counts.astype(np.float32)
                own[term] = np.asarray(idf * counts * (K1 + 1.0) / (counts + norm[posting.rows]), np.float32)
            return own[term]

        for term in query.terms:
            posting = self.terms.get(term)
            if posting is not None:
                scores[posting.rows] += weights(term, posting)
        for words, offsets in query.phrases:
            parts = [self.terms.get(term) for term in words]
            postings = [p for p in parts if p is not None]
            if len(postings) < len(parts):
                continue
            common = postings[0].rows
            for posting in postings[1:]:
                common = np.intersect1d(common, posting.rows, assume_unique=True)
            if not len(common):
                continue
            # Rows holding the terms in the identifier's order, next to each other.
            starts = [
                [{p - offset for p in at} for at in posting.at(common)]
                for posting, offset in zip(postings, offsets, strict=True)
            ]
            matched = [i for i in range(len(common)) if set.intersection(*(s[i] for s in starts))]
            if matched:
                rows = common[matched]
                for term, posting in zip(words, postings, strict=True):
                    scores[rows] += weights(term, posting)[np.searchsorted(posting.rows, rows)]
        return scores


@dataclass(slots=True)
class ViewRanker:
    """BM25 over messages the index has not written yet (a long history that just arrived): each message
    alone, with the one before it, and with both neighbours, as the index's three views hold them
    (`records.message_views`), with the scores `Postings` would give those rows. Per call it counts
    only the question's terms in each message and sums them per view (postings of every term cost 4x
    more); a phrase must stand within one message."""

    analyzer: Analyzer = field(default_factory=Analyzer)
    # Each text's terms, made once: a history in hand is ranked for its question and each of the second
    # hop's leads, and again for the next question while the index still lacks it.
    _analysed: Callable[[str], Analysed] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._analysed = lru_cache(maxsize=ANALYSED_TEXTS)(self._analyse)

    def _analyse(self, text: str) -> Analysed:
        words, at = self.analyzer.terms(cjk_terms(text))
        return words, at, Counter(words)

    def __call__(self, question: str, texts: Sequence[str], limit: int) -> list[tuple[int, str, float]]:
        """(index of the message in `texts`, view, score) for the best `limit` rows, best first; an empty
        text has no views of its own, as in the index."""
        query = self.analyzer.query(question)
        if query is None or limit <= 0 or not texts:
            return []
        columns = {
            t: j
            for j, t in enumerate(dict.fromkeys([*query.terms, *(w for p in query.phrases for w in p[0])]))
        }
        counts = np.zeros((len(texts) + 1, len(columns)), dtype=np.float32)  # the last row: no message
        lengths = np.zeros(len(texts) + 1, dtype=np.float32)
        phrased = np.zeros((len(texts) + 1, len(query.phrases)), dtype=np.bool_)
        for i, text in enumerate(texts):
            if not text:
                continue
            words, at, held = self._analysed(text)
            lengths[i] = len(words)
            for word, j in columns.items():  # the question's few terms, not the text's many
                counts[i, j] = held.get(word, 0)
            for k, (phrase, offsets) in enumerate(query.phrases):
                phrased[i, k] = _holds(words, at, phrase, offsets)
        members, owners = _views(texts)
        if not owners:
            return []
        rows = counts[members].sum(axis=1)
        row_lengths = lengths[members].sum(axis=1)
        held = (rows > 0).sum(axis=0)
        idf = np.log(1.0 + (len(rows) - held + 0.5) / (held + 0.5)).astype(np.float32)
        norm = K1 * (1.0 - B + B * row_lengths / max(float(row_lengths.mean()), 1.0))
        weights = idf * rows * (K1 + 1.0) / (rows + norm[:, None])
        scores = weights[:, [columns[t] for t in query.terms]].sum(axis=1)
        for k, (phrase, _) in enumerate(query.phrases):
            whole = phrased[members, k].any(axis=1)
            scores[whole] += weights[np.ix_(whole, [columns[t] for t in phrase])].sum(axis=1)
        matched = np.flatnonzero(scores > 0)
        if len(matched) > limit:
            matched = matched[np.argpartition(-scores[matched], limit - 1)[:limit]]
        order = matched[np.argsort(-scores[matched], kind="stable")]
        return [(*owners[row], float(scores[row])) for row in order]


def _views(texts: Sequence[str]) -> tuple[Ints, list[tuple[int, str]]]:
    """Each view's messages (up to three; `len(texts)` where fewer) and its owner and kind, as the index
    makes them (`message_views`)."""
    none = len(texts)
    views = message_views([bool(t) for t in texts])
    members = [(*joined, *(none,) * (3 - len(joined))) for _, _, joined in views]
    return np.asarray(members, dtype=np.int32).reshape(-1, 3), [(owner, kind) for owner, kind, _ in views]


def _holds(words: list[str], at: list[int], phrase: tuple[str, ...], offsets: tuple[int, ...]) -> bool:
    """Whether `phrase` stands in these terms in its order, next to each other (as `Postings.scores`)."""
    if not set(phrase) <= set(words):
        return False
    starts = [
        {p - offset for w, p in zip(words, at, strict=True) if w == term}
        for term, offset in zip(phrase, offsets, strict=True)
    ]
    return bool(set.intersection(*starts))
