"""What the serving process sets up for the invoke path: its scheduling policy, the settled garbage collector, the
request ids."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sless_api.gateway import gcsettle
from sless_api.gateway.requestid import accept_or_new, is_request_id, new_request_id


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_settle_freezes_what_exists_and_collects_the_young_less_often(restored_gc: None) -> None:
    kept: list[list[int]] = [[] for _ in range(1000)]  # containers alive when the server is built
    gcsettle.settle()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold()[0] == gcsettle.YOUNG_THRESHOLD
    made_later: list[list[int]] = [[] for _ in range(10)]
    assert all(gc.is_tracked(x) for x in made_later)  # later objects are still the collector's


def test_new_request_ids_look_like_a_uuid_hex_and_do_not_repeat() -> None:
    ids = [new_request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 and is_request_id(i) for i in ids)
    assert accept_or_new([]) != accept_or_new([])


def test_a_forked_child_makes_other_request_ids_than_its_parent() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first ids, to the parent
        os.write(write, "".join(new_request_id() for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    mine = "".join(new_request_id() for _ in range(4))
    with os.fdopen(read, "rb") as pipe:
        theirs = pipe.read().decode()
    os.waitpid(pid, 0)
    assert len(theirs) == 128
    assert theirs != mine


def test_batch_scheduling_is_inherited_by_later_threads_and_processes() -> None:
    probe = (
        "import os, subprocess, sys, threading\n"
        "from sless_api.gateway.batchsched import batch_scheduling\n"
        "assert batch_scheduling()\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))\n"
        "t.start(); t.join()\n"
        "child = subprocess.run([sys.executable, '-c', 'import os; print(os.sched_getscheduler(0))'],\n"
        "                       capture_output=True, text=True, check=True).stdout.strip()\n"
        "print(os.sched_getscheduler(0), seen[0], child)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(os.SCHED_BATCH)] * 3
