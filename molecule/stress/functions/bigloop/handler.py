"""stress-bigloop: pure CPU, a loop of event["n"] iterations (default 2,000,000)."""

import time


def handle(event):
    n = int(event.get("n", 2_000_000))
    start = time.perf_counter()
    total = 0
    for i in range(n):
        total += i * i % 7
    return {"n": n, "checksum": total, "elapsed_sec": round(time.perf_counter() - start, 3)}
