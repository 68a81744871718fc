"""The cyclic garbage collector, settled once the server is built: what exists then is kept out of its scans.

Python's collector scans, at each full collection, every container object alive: after start-up that is the whole
platform (the imported modules, the REST app, the backend), some hundreds of thousands of objects, scanned again and
again although they live as long as the process. Under a load on ``/fn`` a call's own objects (its request,
answer, record) are freed by reference counting, but those queued for a while (invocation records, pooled
connections, access lines of a turn) keep the collector running: it was about 5% of the serving process's CPU,
and each full collection a pause of several milliseconds for every call in flight (their p99).

``settle()`` collects once and then freezes what is left (``gc.freeze``: moved to a generation the collector never
scans), so later collections look only at what was made since, and raises the youngest generation's threshold so
that a burst of calls is not interrupted by a collection every few hundred allocations. Objects made later are
collected as before; frozen ones stay until the process ends, which they would have anyway.
"""

from __future__ import annotations

import gc

#: Allocations (net of deallocations) of container objects between two collections of the youngest generation
#: (Python's default 700): per call, the proxy keeps a few objects alive for a while, not thousands.
YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Collect, freeze what survived (start-up's objects), and collect the youngest generation less often."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
