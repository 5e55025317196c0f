"""The garbage collector's settings for a serving process (`context-gateway serve`): a request's objects
outlive CPython's young generations under load, and full collections then stopped the whole process for
hundreds of milliseconds while freeing almost nothing (BENCHMARKS.md, issue 16); reference counting frees
nearly everything here, and the collector still finds cycles, less often.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

# Allocations (less frees) before a young collection: a few hundred requests' objects, not a fraction
# of one. The middle generation is collected every 20 of those, and the oldest after 10 of those and
# only once a quarter more objects than it holds have reached it (CPython's own rule).
YOUNG_THRESHOLD = 50_000
MIDDLE_FACTOR = 20
OLD_FACTOR = 10


def tune_for_serving() -> None:
    """Fewer young collections, and what startup built (modules, classes, settings) moved out of every
    later collection's way (`gc.freeze`). Call once, when the app is built and before it serves."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_FACTOR, OLD_FACTOR)


def release_free_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc's `malloc_trim`); False where there is no
    such call (musl, macOS). Start-up frees much of what it allocated (ONNX Runtime's graph optimisation,
    the tokenizer files' parsing) in pieces glibc keeps resident: measured 65 MB of a fresh gateway's 324
    (BENCHMARKS.md, issue 29). Call once, when the app's resources are built; it takes a few ms."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


M_ARENA_MAX = -8  # glibc's mallopt parameter number
MALLOC_ARENAS = 2


def limit_malloc_arenas() -> bool:
    """At most MALLOC_ARENAS glibc heaps for the process's threads (as MALLOC_ARENA_MAX=2 would): one per
    thread, LanceDB's and ONNX Runtime's included, each kept its freed pages and grew the process without
    end (BENCHMARKS.md, issue 29). False where there is no such call. Call first, before threads start."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, MALLOC_ARENAS))
