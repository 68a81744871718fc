"""What one API worker's route table holds for a cluster's Functions: ``python -m bench.route_memory``.

Run by bench/operator_scale.py once every Function is Ready, against the cluster in ``KUBECONFIG``: it starts the
route table's list-and-watch as an API worker does (``KubeRouter``: Functions, Triggers and the function Services'
EndpointSlices), waits until everything is listed, and prints one JSON object: the Python heap the table and its
watches still hold after a garbage collection (``tracemalloc``, so what is freed after a list is not counted), the
process's RSS growth (which also keeps what the allocator did not give back), and the number of routes.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
import tracemalloc
from pathlib import Path

from sless_api.backends.kube.client import KubeClient
from sless_api.backends.kube.router import KubeRouter
from sless_api.backends.settings import KubeSettings

LOAD_TIMEOUT_SEC = 600.0


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def measure() -> dict[str, float]:
    settings = KubeSettings.from_env(os.environ)
    kube = KubeClient(settings)
    gc.collect()
    rss_before = rss_kb()
    tracemalloc.start()
    traced_before = tracemalloc.get_traced_memory()[0]
    router = KubeRouter(kube, settings)
    start = time.monotonic()
    router.start()
    try:
        while not (router.loaded() and router.endpoint_watch.loaded()):
            if time.monotonic() - start > LOAD_TIMEOUT_SEC:
                raise TimeoutError("the route table did not load")
            await asyncio.sleep(0.2)
        loaded_s = time.monotonic() - start
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - traced_before
        return {"loaded_s": loaded_s, "held_bytes": held, "rss_growth_kb": rss_kb() - rss_before,
                "routes": len(router.table.routes())}  # fmt: skip
    finally:
        await router.close()
        kube.close()


def main() -> None:
    print(json.dumps(asyncio.run(measure())))


if __name__ == "__main__":
    main()
