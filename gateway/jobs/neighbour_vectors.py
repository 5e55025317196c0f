"""The views with neighbours' vectors, composed from their messages' own vectors instead of embedded.

A view that joins two or three messages is the longest text a job embeds, and the model's time grows
with its width: embedding them took six times as long as the messages' own views (BENCHMARKS.md, issue
28). Its vector is made instead from the vectors of the messages it joins, which the job embeds anyway:
their normalised sum. A question's cosine against it is the members' cosines summed over the sum's
length, so a short reply is found by what its neighbours say, as with the model, and no member is cut
off at the model's input limit (a long message before it filled all 256 word pieces of the joined text).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def composed_all(vectors: Sequence[Sequence[float]], joins: Sequence[Sequence[int]]) -> list[list[float]]:
    """For each of `joins` (positions in `vectors`, unit vectors of one model), the normalised sum of the
    vectors it names; the first when they cancel out, and a single vector as it is. In one array pass: a
    job composes hundreds, and one conversion per view held the event loop for 60 ms (BENCHMARKS.md,
    issue 28)."""
    if not joins:
        return []
    matrix = np.asarray(vectors, dtype=np.float32)
    width = max(len(join) for join in joins)
    # Positions padded with a row of zeros, so every view sums `width` rows.
    padded = np.vstack([matrix, np.zeros((1, matrix.shape[1]), dtype=np.float32)])
    positions = np.full((len(joins), width), len(matrix), dtype=np.intp)
    for row, join in enumerate(joins):
        positions[row, : len(join)] = join
    totals = padded[positions].sum(axis=1)
    norms = np.linalg.norm(totals, axis=1, keepdims=True)
    singles = np.array([len(join) == 1 for join in joins])
    # A single vector as it is; a sum that cancels out gives way to its first member.
    keep = singles | (norms[:, 0] == 0.0)
    out = np.where(keep[:, None], padded[positions[:, 0]], totals / np.where(norms == 0.0, 1.0, norms))
    rows: list[list[float]] = out.tolist()
    return rows
