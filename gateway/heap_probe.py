"""Heap snapshots on request, for soaks: with `GATEWAY_HEAP_SNAPSHOTS=DIR` set, a serving process traces
allocations (tracemalloc, one frame) and, on each SIGUSR2, writes what grew since its first snapshot to
`DIR/heap-<pid>-<n>.txt` (the first signal takes the baseline). Off unless set: tracing costs memory and
time on every allocation."""

from __future__ import annotations

import os
import signal
import tracemalloc
from pathlib import Path
from types import FrameType

ENV = "GATEWAY_HEAP_SNAPSHOTS"
TOP = 30  # the lines of the diff written: what grew most


class HeapProbe:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.baseline: tracemalloc.Snapshot | None = None
        self.taken = 0

    def snapshot(self) -> Path:
        """A snapshot: the baseline the first time, then the growth since it, written to a file."""
        current = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),)
        )
        self.taken += 1
        out = self.directory / f"heap-{os.getpid()}-{self.taken}.txt"
        traced, peak = tracemalloc.get_traced_memory()
        lines = [f"traced {traced / 2**20:.1f} MB, peak {peak / 2**20:.1f} MB"]
        if self.baseline is None:
            self.baseline = current
            lines += [str(s) for s in current.statistics("lineno")[:TOP]]
        else:
            lines += [str(s) for s in current.compare_to(self.baseline, "lineno")[:TOP]]
        out.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return out


def install_from_env() -> HeapProbe | None:
    """Start tracing and answer SIGUSR2 when the environment asks for it; None (and nothing done) else."""
    directory = os.environ.get(ENV)
    if not directory:
        return None
    Path(directory).mkdir(parents=True, exist_ok=True)
    tracemalloc.start(1)
    probe = HeapProbe(Path(directory))

    def on_signal(_number: int, _frame: FrameType | None) -> None:
        probe.snapshot()

    signal.signal(signal.SIGUSR2, on_signal)
    return probe
