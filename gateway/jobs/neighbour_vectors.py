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


def composed(vectors: Sequence[Sequence[float]]) -> list[float]:
    """The normalised sum of `vectors` (unit vectors of one model); the first when they cancel out, and
    a single vector as it is."""
    if len(vectors) == 1:
        return list(vectors[0])
    total = np.asarray(vectors, dtype=np.float32).sum(axis=0)
    norm = float(np.linalg.norm(total))
    if norm == 0.0:
        return [float(x) for x in vectors[0]]
    return [float(x) for x in total / norm]
