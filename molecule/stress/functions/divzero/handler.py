"""stress-divzero: divides 42 by event["d"] (default 0): a Python crash on purpose."""


def handle(event):
    d = float(event.get("d", 0))
    return {"result": 42 / d}
