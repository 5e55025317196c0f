"""The word-piece vectors `static_meaning.py` ranks with, distilled from the bundled embedding model.

Each of all-MiniLM-L6-v2's 30,522 word pieces is run through the model alone (`[CLS] piece [SEP]`) and
its output pooled as the model pools a sentence (mean, no normalisation), as model2vec distils a
sentence model into static vectors. The vectors are projected onto their 256 main axes (not centred:
centring lost a tenth of LoCoMo's evidence in the top 40) and stored as int8 with a scale per row,
7.8 MB. Run `python -m gateway.adapters.static_table` to write them again (~20 s on two cores); the
projection is kept beside them so a test can check rows against the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import as_file, files
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

DIMENSIONS = 256
TABLE_FILE = "all-MiniLM-L6-v2-static.npy"  # int8 [pieces, DIMENSIONS]
SCALE_FILE = "all-MiniLM-L6-v2-static-scale.npy"  # float32 [pieces]: a row's value per int8 step
AXES_FILE = "all-MiniLM-L6-v2-static-axes.npy"  # float32 [DIMENSIONS, 384]: the projection
_CLS, _SEP = 101, 102
_BATCH = 1_024

FloatArray = npt.NDArray[np.float32]


def pooled(session: ort.InferenceSession, pieces: npt.NDArray[np.int64]) -> FloatArray:
    """The model's mean-pooled output for each word piece alone, between [CLS] and [SEP]."""
    out = np.empty((len(pieces), 384), dtype=np.float32)
    for start in range(0, len(pieces), _BATCH):
        chunk = pieces[start : start + _BATCH]
        ids = np.stack([np.full_like(chunk, _CLS), chunk, np.full_like(chunk, _SEP)], axis=1)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        (hidden,) = session.run(["last_hidden_state"], feeds)
        out[start : start + len(chunk)] = np.asarray(hidden, dtype=np.float32).mean(axis=1)
    return out


def quantised(rows: FloatArray) -> tuple[npt.NDArray[np.int8], FloatArray]:
    """Each row as int8 steps of its own scale."""
    scale = (np.abs(rows).max(axis=1) / 127.0).astype(np.float32)
    scale[scale == 0] = 1.0
    return np.round(rows / scale[:, None]).astype(np.int8), scale


def distil(session: ort.InferenceSession, pieces: int) -> tuple[npt.NDArray[np.int8], FloatArray, FloatArray]:
    """The table, its scales and its projection, for word pieces 0..pieces-1."""
    vectors = pooled(session, np.arange(pieces, dtype=np.int64))
    _, _, axes = np.linalg.svd(vectors, full_matrices=False)
    axes = axes[:DIMENSIONS].astype(np.float32)
    table, scale = quantised(vectors @ axes.T)
    return table, scale, axes


@contextmanager
def data_file(name: str) -> Iterator[Path]:
    """A shipped data file's path while the block runs (a temporary copy where the package is zipped:
    read it, or map it, inside the block; a mapping outlives the copy on POSIX)."""
    with as_file(files("gateway.adapters") / "data" / name) as path:
        yield Path(path)


def main() -> None:
    from gateway.adapters.onnx_embedder import OnnxEmbedder

    embedder = OnnxEmbedder(threads=2)
    session = embedder._session
    assert session is not None
    table, scale, axes = distil(session, embedder._tokenizer.get_vocab_size())
    for name, array in ((TABLE_FILE, table), (SCALE_FILE, scale), (AXES_FILE, axes)):
        with data_file(name) as path:
            np.save(path, array)
        print(f"wrote {path} {array.shape} {array.dtype}")


if __name__ == "__main__":
    main()
