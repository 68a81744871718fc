"""stress-slow: sleeps event["sec"] seconds (default 3), so concurrent slow calls must not queue."""

import time


def handle(event):
    sec = float(event.get("sec", 3))
    time.sleep(sec)
    return {"slept_sec": sec}
