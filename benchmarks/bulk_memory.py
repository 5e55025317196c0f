"""Where a bulk import's memory goes: `python -m gateway serve` (default settings) gets `--messages` LoCoMo
messages in one request; its resident memory is read from /proc/PID/smaps every `--every` seconds
(default 1), grouped by mapping, until every message is indexed with its neighbours (issue 29).

    python benchmarks/bulk_memory.py                  # 2,500 messages
    python benchmarks/bulk_memory.py --messages 700

Groups: glibc's main heap (`heap`), its other arena (`arena64`: mappings of 60 MB and more, the threads'
allocations: ONNX Runtime, LanceDB, the vector cache's merges), blocks above the mmap threshold and other
anonymous mappings (`anon-other`), Python's small-object pools (`pymalloc`), each library (`lib:`).
Prints the groups before the import, every new peak of the total, the peak of each group and the end.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bulk_index import LOCOMO, history  # noqa: E402
from cache import KEY, GatewayProcess  # noqa: E402

from gateway.fakes.openai_upstream import FakeUpstream  # noqa: E402
from gateway.fakes.server import BackgroundServer  # noqa: E402

AUTH = {"authorization": f"Bearer {KEY}"}


def groups(pid: int) -> collections.Counter[str]:
    """Resident MB by kind of mapping."""
    out: collections.Counter[str] = collections.Counter()
    name = "?"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and "-" in parts[0] and ":" not in parts[0]:
            low, high = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5] if len(parts) > 5 else ""
            if path == "[heap]":
                name = "heap"
            elif path.startswith("/"):
                name = "lib:" + path.rsplit("/", 1)[-1][:32]
            elif path:
                name = path
            elif high - low >= 60 << 20:
                name = "arena64"
            elif high - low in (1 << 20, 256 << 10):
                name = "pymalloc"
            else:
                name = "anon-other"
        elif parts and parts[0] == "Rss:":
            out[name] += int(parts[1]) // 1024
    return out


def shown(counter: collections.Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counter.most_common(6))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=2500)
    parser.add_argument("--limit", type=float, default=900, help="seconds to wait for the index")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    args = parser.parse_args()
    turns = history(LOCOMO, args.messages)
    if turns[-1]["role"] == "assistant":
        turns.append({"role": "user", "content": "Thanks, talk soon."})
    fake = FakeUpstream(record=False)
    with tempfile.TemporaryDirectory() as tmp, BackgroundServer(fake.app()) as upstream:
        gateway = GatewayProcess(ROOT, Path(tmp), f"{upstream.url}/v1")
        pid = gateway.process.pid
        try:
            with httpx.Client(base_url=gateway.url, timeout=600) as http:
                hello = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
                http.post("/v1/chat/completions", json=hello, headers=AUTH).raise_for_status()
                time.sleep(3)
                before = groups(pid)
                print(f"before the import: {sum(before.values())} MB ({shown(before)})", flush=True)
                peak: collections.Counter[str] = collections.Counter()
                top = [0]
                stop = threading.Event()
                started = time.monotonic()

                def sample() -> None:
                    while not stop.is_set():
                        now = groups(pid)
                        for key, value in now.items():
                            peak[key] = max(peak[key], value)
                        if sum(now.values()) > top[0]:
                            top[0] = sum(now.values())
                            print(
                                f"  {time.monotonic() - started:5.0f} s: {top[0]} MB ({shown(now)})",
                                flush=True,
                            )
                        time.sleep(args.every)

                sampler = threading.Thread(target=sample)
                sampler.start()
                body = {"model": "gpt-4o-mini", "messages": turns}
                response = http.post("/v1/chat/completions", json=body, headers={**AUTH, "x-user-id": "bulk"})
                response.raise_for_status()
                conversation_id = response.headers["x-conversation-id"]
                time.sleep(3)  # the history's jobs are queued once its answer is stored
                while time.monotonic() - started < args.limit:
                    index = http.get(f"/api/conversations/{conversation_id}", headers=AUTH).json()["index"]
                    if index["complete"] and index["with_neighbours"] >= len(turns):
                        break
                    time.sleep(2)
                stop.set()
                sampler.join()
                end = groups(pid)
                print(f"indexed after {time.monotonic() - started:.0f} s; peak {top[0]} MB")
                print(f"peak of each group: {shown(peak)}")
                print(f"at the end: {sum(end.values())} MB ({shown(end)})")
        finally:
            gateway.close()


if __name__ == "__main__":
    main()
