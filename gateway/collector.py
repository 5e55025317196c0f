"""The interpreter's settings for a serving process (`context-gateway serve`): a request's objects
outlive CPython's young generations under load, and full collections then stopped the whole process for
hundreds of milliseconds while freeing almost nothing (BENCHMARKS.md, issue 16); reference counting frees
nearly everything here, and the collector still finds cycles, less often. And the GIL changes hands more
often, so the event loop waits less for the background jobs' threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import cast

# Allocations (less frees) before a young collection: a few hundred requests' objects, not a fraction
# of one. The middle generation is collected every 20 of those, and the oldest after 10 of those and
# only once a quarter more objects than it holds have reached it (CPython's own rule).
YOUNG_THRESHOLD = 50_000
MIDDLE_FACTOR = 20
OLD_FACTOR = 10
# Seconds a thread holds the GIL while another waits for it (CPython's default 0.005): the event loop
# waited up to that long for an indexing thread at every handover (p99 while a long history is indexed,
# 2.28-3.13x idle at 5 ms, 1.51-1.70x at 1 ms; BENCHMARKS.md, issue 28).
SWITCH_INTERVAL = 0.001


def tune_for_serving() -> None:
    """Fewer young collections, what startup built (modules, classes, settings) moved out of every later
    collection's way (`gc.freeze`), a shorter GIL switch interval. Call once, when the app is built and
    before it serves."""
    sys.setswitchinterval(SWITCH_INTERVAL)
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_FACTOR, OLD_FACTOR)


@functools.cache
def jemalloc_loaded() -> bool:
    """Whether jemalloc serves this process's malloc (preloaded, as the Docker image does): then glibc's
    settings and trims reach nothing, and jemalloc's own decay returns freed pages."""
    try:
        return hasattr(ctypes.CDLL(None), "mallctl")
    except OSError:
        return False


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, looked up once; None where there is no such call (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return cast(Callable[[int], int], trim)


def release_free_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc's `malloc_trim`); False where there is no
    such call. Start-up frees much of what it allocated (ONNX Runtime's graph optimisation, the tokenizer
    files' parsing) in pieces glibc keeps resident: measured 65 MB of a fresh gateway's 324 (BENCHMARKS.md,
    issue 29). Called when the app's resources are built and then every TRIM_EVERY_SECONDS; a few ms."""
    trim = _malloc_trim()
    if trim is None or jemalloc_loaded():
        return False
    trim(0)
    return True


# How often a serving process hands its C heap's free pages back (`trimming_heap`).
TRIM_EVERY_SECONDS = 30.0

# glibc's mallopt parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MALLOC_ARENAS = 2
# Blocks this large or larger get pages of their own, returned to the system when freed. glibc's own
# threshold starts at 128 KiB but rises to the largest block freed (up to 32 MiB), after which request
# bodies, Arrow buffers and ONNX Runtime's tensors were carved out of the heap and left it fragmented:
# the soak's heap grew by 500 MB in ten minutes (BENCHMARKS.md, issue 29). Setting it keeps it fixed.
MMAP_THRESHOLD_BYTES = 256 * 1024
# Free memory at the heap's top beyond this goes back to the system at once.
TRIM_THRESHOLD_BYTES = 1024 * 1024
# pyarrow's own pool (mimalloc) kept what LanceDB's rows passed through it: 7,500 rows written in 50
# writes left a process 75 MB larger than on the system's allocator (BENCHMARKS.md, issue 29).
ARROW_POOL = "system"


def tune_malloc() -> bool:
    """glibc's allocator set for a long-running process: at most MALLOC_ARENAS heaps for its threads (one
    per thread, LanceDB's and ONNX Runtime's included, each kept its freed pages), large blocks in pages
    of their own at a fixed threshold, and the heap's free top returned. False where there is no such
    call (musl, macOS) or jemalloc serves malloc. Call first, before threads start (BENCHMARKS.md, issue
    29). The fixed threshold costs the background jobs ~12 % more time (pages mapped afresh per block);
    jemalloc held as little without that cost, hence the Docker image's. Arrow's buffers go to that
    allocator too (`ARROW_POOL`)."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", ARROW_POOL)  # read by pyarrow's first allocation
    if jemalloc_loaded():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    settings = (
        (M_ARENA_MAX, MALLOC_ARENAS),
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
    )
    return all([bool(mallopt(number, value)) for number, value in settings])


@contextlib.asynccontextmanager
async def trimming_heap(every_seconds: float = TRIM_EVERY_SECONDS) -> AsyncIterator[None]:
    """While the block runs, `release_free_heap` every `every_seconds`, in a thread (ctypes lets go of the
    interpreter meanwhile): on its own glibc gives back only a heap's free top. A few ms a call; alone it
    did not stop the soak's growth, which the fixed mmap threshold did (BENCHMARKS.md, issue 29)."""

    async def loop() -> None:
        while True:
            await asyncio.sleep(every_seconds)
            if not await asyncio.to_thread(release_free_heap):
                return  # no malloc_trim here

    task = asyncio.create_task(loop(), name="heap-trim")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
