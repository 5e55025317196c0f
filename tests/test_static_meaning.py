"""The static word-piece ranking used while a history waits for its vectors (adapters/static_meaning.py):
the shipped table is the bundled model's, and it ranks by meaning where no word is shared."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gateway.adapters import static_meaning
from gateway.adapters.onnx_embedder import OnnxEmbedder
from gateway.adapters.static_meaning import StaticMeaning
from gateway.adapters.static_table import AXES_FILE, SCALE_FILE, TABLE_FILE, data_file, pooled
from gateway.pipeline.context.retrieval_unindexed import by_static_meaning, names_exact_terms

TOPICS = ["the garden", "a novel", "the weekend hike", "bread baking", "a podcast", "the football match"]
VIOLIN = "By the way, I started violin lessons with a teacher called Anna last week."


def chat(planted_at: int = 7) -> list[str]:
    texts: list[str] = []
    for i in range(200):
        user = VIOLIN if i == planted_at else f"Turn {i}: tell me more about {TOPICS[i % 6]}, please."
        texts += [user, f"Of course. On {TOPICS[i % 6]}, here are a few thoughts ({i})."]
    return texts


def test_the_shipped_table_is_the_bundled_models_word_pieces_projected() -> None:
    """Rows recomputed from the model (each word piece alone, pooled) and projected onto the shipped axes
    equal the shipped int8 rows within one step of their scale."""
    with data_file(TABLE_FILE) as t, data_file(SCALE_FILE) as s, data_file(AXES_FILE) as a:
        table, scale, axes = np.load(t, mmap_mode="r"), np.load(s), np.load(a)
    embedder = OnnxEmbedder(threads=1)
    assert embedder._session is not None
    assert table.shape == (embedder._tokenizer.get_vocab_size(), axes.shape[0])
    pieces = np.random.default_rng(7).choice(len(table), 48, replace=False).astype(np.int64)
    expected = pooled(embedder._session, pieces) @ axes.T
    shipped = table[pieces].astype(np.float32) * scale[pieces, None]
    assert np.all(np.abs(expected - shipped) <= scale[pieces, None] * 1.01)


def test_a_question_sharing_no_word_with_its_answer_ranks_it_first() -> None:
    texts = chat()
    ranked = StaticMeaning()("Which musical instrument am I learning to play?", texts, 10)
    assert ranked[0][0] == texts.index(VIOLIN)
    assert [score for _, score in ranked] == sorted((score for _, score in ranked), reverse=True)
    assert len(ranked) == 10


def test_nothing_to_rank_gives_nothing() -> None:
    meaning = StaticMeaning()
    assert meaning("", chat(), 5) == []
    assert meaning("violin", [], 5) == []
    assert meaning("violin", chat(), 0) == []


def test_a_history_ranked_again_gives_the_same_ranking_and_a_changed_one_its_own() -> None:
    """Its text vectors are kept per history (each question over it reuses them), keyed by the texts."""
    meaning = StaticMeaning()
    first = meaning("Which musical instrument am I learning to play?", chat(7), 3)
    assert meaning("Which musical instrument am I learning to play?", chat(7), 3) == first
    moved = meaning("Which musical instrument am I learning to play?", chat(90), 3)
    assert moved[0][0] == chat(90).index(VIOLIN) != first[0][0]


def test_a_question_naming_an_exact_term_is_ranked_by_keyword_alone_unless_it_is_mostly_cjk() -> None:
    """Static vectors rank a history in hand for a question without exact terms (a year alone is none),
    and for a mostly CJK one with them; an English question naming an identifier or a number has
    keyword lead alone."""
    assert names_exact_terms(("fx-rates",)) and names_exact_terms(("2022", "6060"))
    assert not names_exact_terms(("2022",)) and not names_exact_terms(())
    assert by_static_meaning("Where was James on July 12, 2022?", ("2022",))
    assert not by_static_meaning("On which box is fx-rates deployed?", ("fx-rates",))
    assert by_static_meaning("fx-rates 部署在哪台机器上？", ("fx-rates",))


def test_a_missing_table_leaves_the_ranking_empty_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A package built without the table ranks nothing by static vectors (keyword still ranks), once
    logged; it does not fail the request."""
    meaning = StaticMeaning(table_path=tmp_path / "absent.npy")
    with caplog.at_level(logging.ERROR):
        assert meaning("Which musical instrument am I learning to play?", chat(), 10) == []
        assert meaning("And which teacher?", chat(), 10) == []
    assert [r.message for r in caplog.records].count(
        "static word-piece vectors unavailable: histories in hand ranked by keyword"
    ) == 1


def test_the_pieces_kept_are_bounded_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Word pieces are kept for the last `PIECED_TEXTS` texts (keyed by hash: the texts themselves are
    not kept), and `cache_bytes` counts what is held, for /metrics."""
    monkeypatch.setattr(static_meaning, "PIECED_TEXTS", 10)
    meaning = StaticMeaning()
    assert meaning.cache_bytes() == {"static_pieces": 0, "static_histories": 0}
    texts = chat()
    ranked = meaning("Which musical instrument am I learning to play?", texts, 5)
    assert ranked[0][0] == texts.index(VIOLIN)
    held = meaning.cache_bytes()
    assert len(meaning._pieced) == 10
    assert held["static_pieces"] == sum(sys.getsizeof(p) for p in meaning._pieced.values())
    assert held["static_histories"] >= len(texts) * 256 * 4  # a float32 vector of 256 a text
    meaning._histories.clear()  # ranked again from pieces, most of them evicted and read again
    assert meaning("Which musical instrument am I learning to play?", texts, 5) == ranked


def test_the_table_is_read_from_a_zipped_package(tmp_path: Path) -> None:
    """A package imported from a zip (a zipapp) has no file to map: the shipped files are read from
    temporary copies while they are loaded, and the ranking works (it was empty, logged, before)."""
    package = Path(static_meaning.__file__).resolve().parents[1]
    archive = tmp_path / "gateway.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in package.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                zipped.write(path, path.relative_to(package.parent))
    script = (
        "import gateway.adapters.static_meaning as m; assert '.zip' in m.__file__; "
        "print(m.StaticMeaning()('Which musical instrument am I learning to play?', "
        "['We went hiking on Sunday.', 'I started violin lessons last week.'], 2)[0][0])"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(archive)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "1"
