"""The CLI's verbs for what a function has around it: removal, triggers, jobs, its source, a log that follows.

Each verb is a thin mapping onto one or two REST calls, so the CLI never knows more than the API says;
``--output json`` prints the API's own JSON for scripts, the default is a table for people.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from sless_api.cli.client import Client, CliError, emit, table

Verb = Callable[[argparse.Namespace, Client], int]


def one_line(text: Any, width: int) -> str:
    """Any text as one line of at most WIDTH characters (build logs have many lines)."""
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


# -- functions -------------------------------------------------------------------------------------


#: ``sless scale``'s flags: flag's attribute -> the key in ``scale``
SCALE_FLAGS = {"min": "min", "max": "max", "target": "target", "idle_sec": "idle_sec"}


def scale_short(scale: dict[str, Any] | None) -> str:
    """A function's ``scale`` as one word for ``sless ls``: ``fixed``, or ``scale:MIN-MAX``."""
    return "fixed" if not scale else f"scale:{scale['min']}-{scale['max']}"


def scale_text(scale: dict[str, Any] | None) -> str:
    """A function's ``scale`` in words: ``fixed replicas``, or its bounds, target and idle time."""
    if not scale:
        return "fixed replicas (no scale)"
    return (f"{scale['min']}..{scale['max']} replicas, target {scale['target']} calls in flight per replica, "
            f"back to {scale['min']} after {scale['idle_sec']}s without calls")


def function_details(fn: dict[str, Any]) -> str:
    """``sless get``: a function's settings and state, one per line."""
    rows = [("name", fn["name"]), ("runtime", fn["runtime"]), ("entrypoint", fn.get("entrypoint")),
            ("phase", fn["phase"]), ("memory_mb", fn.get("memory_mb")), ("timeout_sec", fn.get("timeout_sec")),
            ("max_concurrency", fn.get("max_concurrency") or "no limit of its own"),
            ("scale", scale_text(fn.get("scale"))), ("sandbox", fn.get("sandbox") or "the platform's default"),
            ("code_hash", fn.get("code_hash") or "-"), ("message", one_line(fn.get("message"), 200) or "-")]
    return "\n".join(f"{key + ':':16} {value}" for key, value in rows)


def cmd_get(args: argparse.Namespace, client: Client) -> int:
    record = client.request("GET", client.ns_path(f"/functions/{args.name}"))
    emit(record, args.output == "json", function_details(record))
    return 0


def cmd_scale(args: argparse.Namespace, client: Client) -> int:
    """Change only the given fields of a function's ``scale`` (``--off``: remove it); no flag: show it."""
    given = {key: getattr(args, attr) for attr, key in SCALE_FLAGS.items() if getattr(args, attr) is not None}
    path = client.ns_path(f"/functions/{args.name}")
    if args.off and given:
        raise CliError("--off removes scaling: give it alone, without --min/--max/--target/--idle-sec")
    if args.off:
        record = client.request("PATCH", path, json={"scale": None})
    elif given:
        record = client.request("PATCH", path, json={"scale": given})  # the API merges it into the current one
    else:
        record = client.request("GET", path)
    emit(record, args.output == "json", f"{record['name']}: {scale_text(record.get('scale'))}")
    return 0


def cmd_rm(args: argparse.Namespace, client: Client) -> int:
    client.request("DELETE", client.ns_path(f"/functions/{args.name}"))
    print(f"deleted function {args.name} (and its triggers)", file=sys.stderr)
    return 0


def cmd_source(args: argparse.Namespace, client: Client) -> int:
    files: list[dict[str, Any]] = client.request("GET", client.ns_path(f"/functions/{args.name}/source"))["files"]
    if args.out:
        write_source(Path(args.out), files)
        print(f"wrote {len(files)} file(s) to {args.out}", file=sys.stderr)
        return 0
    if args.output == "json":
        emit({"files": files}, True, "")
        return 0
    for item in files:
        print(f"==> {item['name']}{' (binary, base64)' if item['binary'] else ''} <==")
        print(item["content"])
    return 0


def write_source(folder: Path, files: list[dict[str, Any]]) -> None:
    """Write the files under FOLDER; a name that would land outside it (absolute, ``..``) is refused first."""
    import base64

    targets = []
    for item in files:
        rel = PurePosixPath(str(item["name"]))
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise CliError(f"refusing to write {item['name']!r}: it is not a path inside {folder}")
        data = base64.b64decode(item["content"]) if item["binary"] else str(item["content"]).encode()
        targets.append((folder.joinpath(*rel.parts), data))
    for path, data in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def cmd_logs(args: argparse.Namespace, client: Client) -> int:
    """Recent invocations, oldest first (``-o json``: the API's answer); with --follow, new ones as they are
    recorded, each with what the call wrote under it (Ctrl-C ends; ``-o json``: one record per line, its lines in
    ``output``; ``--no-output``: the records only); with --id, what that one call wrote."""
    path = client.ns_path(f"/functions/{args.name}/invocations")
    if args.id is not None:
        return print_call_output(client.request("GET", f"{path}/{args.id}/logs"), args.output == "json")
    listed: dict[str, Any] = client.request("GET", path, params={"limit": args.limit})
    items: list[dict[str, Any]] = listed["items"]
    last = max((int(i["id"]) for i in items if i.get("id") is not None), default=0)
    if args.output == "json" and not args.follow:
        emit(listed, True, "")  # the API's own answer (newest first); --follow streams JSON lines instead
        return 0
    as_json = args.output == "json"
    output = args.follow and not args.no_output
    headed = as_json  # JSON lines have no header; a table gets one above its first row
    headed = print_followed(client, path, list(reversed(items)), as_json, headed, output)
    while args.follow:
        time.sleep(args.interval)
        fresh = [i for i in client.request("GET", path, params={"limit": 500})["items"] if int(i["id"]) > last]
        headed = print_followed(client, path, list(reversed(fresh)), as_json, headed, output)
        last = max([last, *(int(i["id"]) for i in fresh)])
        sys.stdout.flush()
    return 0


#: ``sless logs --follow``: the most calls per poll whose output is fetched (one request each); the rest say how
#: to read theirs, so a burst of calls does not turn into a burst of requests.
FOLLOW_OUTPUTS_PER_POLL = 20


def print_followed(client: Client, path: str, items: list[dict[str, Any]], as_json: bool, headed: bool,
                   output: bool) -> bool:
    """Records oldest first, each with its call's lines under it when OUTPUT (see ``cmd_logs``)."""
    for n, item in enumerate(items):
        lines: dict[str, Any] | None = None
        if output and n < FOLLOW_OUTPUTS_PER_POLL and item.get("request_id"):
            try:
                lines = client.request("GET", f"{path}/{item['id']}/logs")
            except CliError:  # a cluster that keeps no output and lets the API read no pod logs: records only
                lines = None
        if as_json:
            print(json.dumps(item | ({"output": lines} if lines is not None else {}), sort_keys=True))
            headed = True
            continue
        headed = print_invocation(item, as_json, headed)
        for line in (lines or {}).get("lines", []):
            print(f"    {'! ' if line['stream'] == 'stderr' else '| '}{line['text']}")
        if lines is not None and lines.get("truncated"):
            print("    [sless: this call wrote more than is kept; the rest is cut]")
    skipped = len(items) - FOLLOW_OUTPUTS_PER_POLL
    if output and skipped > 0 and not as_json:
        print(f"    [sless: {skipped} more calls came at once; see their output with --id]")
    return headed


#: ``sless logs``' columns: fixed widths, since --follow prints rows as they come (no widths known in advance)
INVOCATION_ROW = "{:>8} {:20} {:8} {:6} {:>6} {:>4} {:>11} {:4} {:32} {} {}"
INVOCATION_HEADER = INVOCATION_ROW.format("ID", "STARTED", "VIA", "METHOD", "STATUS", "VER", "DURATION", "COLD",
                                          "REQUEST ID", "PATH", "ERROR").rstrip()


def print_invocation(item: dict[str, Any], as_json: bool, headed: bool = True) -> bool:
    """Print one invocation (a JSON line, or a table row, under the header when HEADED is still False); returns
    whether the header is out."""
    if as_json:
        print(json.dumps(item, sort_keys=True))
        return True
    if not headed:
        print(INVOCATION_HEADER)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(item["started_at"])))
    cold = "-" if item.get("cold") is None else "cold" if item["cold"] else "warm"
    version = f"v{item['version']}" if item.get("version") is not None else "-"
    via = item["trigger"] if item.get("attempt") is None else f"{item['trigger']}#{item['attempt']}"  # event#2
    print(INVOCATION_ROW.format(item.get("id") or "-", at, via, item["method"], item["status"], version,
                                f"{item['duration_ms']:.1f}ms", cold, item.get("request_id") or "-",
                                one_line(item["path"], 40), one_line(item.get("error"), 60) or "").rstrip())
    return True


def print_call_output(found: dict[str, Any], as_json: bool) -> int:
    """One call's lines as the function wrote them: stderr's on stderr, the rest on stdout."""
    if as_json:
        print(json.dumps(found, sort_keys=True))
        return 0
    for line in found["lines"]:
        print(line["text"], file=sys.stderr if line["stream"] == "stderr" else sys.stdout)
    if found.get("truncated"):
        print("[sless: this call wrote more than is kept; the rest is cut]", file=sys.stderr)
    return 0


# -- triggers --------------------------------------------------------------------------------------


TRIGGER_HEADER = ("NAME", "TYPE", "FUNCTION", "STATE", "AUTH", "SCHEDULE/QUEUE/URL")


def trigger_row(t: dict[str, Any]) -> tuple[str, ...]:
    """A trigger as a row: what fires it in full (a URL is to be copied, so it is never cut)."""
    what = t.get("schedule") or t.get("queue") or t.get("url") or "-"
    state = "enabled" if t.get("enabled", True) else "disabled"
    auth = (t.get("auth") or "-") if t["type"] == "http" else "-"
    return (t["name"], t["type"], t["function"], state, auth, " ".join(str(what).split()))


def triggers_table(items: list[dict[str, Any]]) -> str:
    return table(TRIGGER_HEADER, (trigger_row(t) for t in items))


def cmd_trigger_ls(args: argparse.Namespace, client: Client) -> int:
    items = [t for t in client.items("/triggers") if args.function in (None, t["function"])]
    emit({"items": items}, args.output == "json", triggers_table(items))
    return 0


def cmd_trigger_add(args: argparse.Namespace, client: Client) -> int:
    spec: dict[str, Any] = {"name": args.name, "type": args.type, "function": args.function,
                            "enabled": not args.disabled}
    for key in ("schedule", "queue", "delivery", "auth", "path"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    if args.methods is not None:
        spec["methods"] = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.cors_origins:
        spec["cors"] = {"origins": args.cors_origins}
    created = client.request("POST", client.ns_path("/triggers"), json=spec)
    emit(created, args.output == "json", triggers_table([created]))
    return 0


def toggle(enabled: bool) -> Verb:
    def cmd(args: argparse.Namespace, client: Client) -> int:
        record = client.request("PATCH", client.ns_path(f"/triggers/{args.name}"), json={"enabled": enabled})
        emit(record, args.output == "json", triggers_table([record]))
        return 0

    return cmd


def cmd_trigger_rm(args: argparse.Namespace, client: Client) -> int:
    client.request("DELETE", client.ns_path(f"/triggers/{args.name}"))
    print(f"deleted trigger {args.name}", file=sys.stderr)
    return 0


# -- jobs ------------------------------------------------------------------------------------------


JOB_HEADER = ("NAME", "FUNCTION", "RUN", "PHASE", "MESSAGE")


def job_row(j: dict[str, Any]) -> tuple[str, ...]:
    return (j["name"], j["function"], str(j["run_id"]), j["phase"], one_line(j.get("message"), 60) or "-")


def jobs_table(items: list[dict[str, Any]]) -> str:
    return table(JOB_HEADER, (job_row(j) for j in items))


def cmd_job_run(args: argparse.Namespace, client: Client) -> int:
    """Create the job (run_id 1), or run an existing one again with the next run_id."""
    event = parse_event(args.event)
    found = client.request("GET", client.ns_path(f"/jobs/{args.name}"), ok=(200, 404))
    if found is None or "error" in found:
        if not args.function:
            raise CliError(f"job {args.name} does not exist yet: --function is needed to create it")
        record = client.request("POST", client.ns_path("/jobs"),
                                json={"name": args.name, "function": args.function, "event": event, "run_id": 1})
    else:
        if args.function and args.function != found["function"]:
            raise CliError(f"job {args.name} runs {found['function']}, not {args.function}: delete it first")
        record = client.request("PATCH", client.ns_path(f"/jobs/{args.name}"), json={"run_id": found["run_id"] + 1})
    if args.wait:
        record = wait_job(client, args.name, args.wait)
    emit(record, args.output == "json", jobs_table([record]))
    return 0 if record["phase"] != "Failed" else 1


def parse_event(text: str | None) -> Any:
    if text is None:
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"--event is not JSON: {exc}") from None


def wait_job(client: Client, name: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        record: dict[str, Any] = client.request("GET", client.ns_path(f"/jobs/{name}"))
        if record["phase"] in ("Succeeded", "Failed") or time.monotonic() > deadline:
            return record
        time.sleep(0.3)


def cmd_job_ls(args: argparse.Namespace, client: Client) -> int:
    items = client.items("/jobs")
    emit({"items": items}, args.output == "json", jobs_table(items))
    return 0


def cmd_job_get(args: argparse.Namespace, client: Client) -> int:
    record = wait_job(client, args.name, args.wait) if args.wait else client.request(
        "GET", client.ns_path(f"/jobs/{args.name}"))
    emit(record, args.output == "json",
         jobs_table([record]) + (f"\n\n{record['message']}" if record.get("message") else ""))
    return 0


def cmd_job_rm(args: argparse.Namespace, client: Client) -> int:
    client.request("DELETE", client.ns_path(f"/jobs/{args.name}"))
    print(f"deleted job {args.name}", file=sys.stderr)
    return 0


# -- the parser ------------------------------------------------------------------------------------


def register(verbs: Any, with_client: Callable[[argparse.ArgumentParser, Verb], None]) -> None:
    """Add this module's verbs to the ``sless`` parser; WITH_CLIENT adds --url/--output/... and binds the verb."""
    get = verbs.add_parser("get", help="a function's settings (scale included) and state")
    get.add_argument("name")
    with_client(get, cmd_get)
    scale = verbs.add_parser(
        "scale", help="scale a function with demand: change only the given fields, --off for fixed replicas; "
                      "no flag: show its scale",
        description="Demand-driven replicas: between --min and --max, aiming at --target calls in flight per "
                    "replica, back to --min after --idle-sec without calls (--min 0: scale to zero). Only the "
                    "flags given change; a function without scale gets the defaults for the others (min 0, max 10, "
                    "target 10, idle 300 s). On Kubernetes this needs KEDA in the cluster.")
    scale.add_argument("name")
    scale.add_argument("--min", type=int, help="replicas when idle (0..100; 0: scale to zero)")
    scale.add_argument("--max", type=int, help="replicas at most (1..100)")
    scale.add_argument("--target", type=int, help="calls in flight per replica (1..1000)")
    scale.add_argument("--idle-sec", dest="idle_sec", type=int,
                       help="seconds without calls before going back to --min (5..86400)")
    scale.add_argument("--off", action="store_true", help="remove scaling: fixed replicas again")
    with_client(scale, cmd_scale)
    rm = verbs.add_parser("rm", help="delete a function (and its triggers)")
    rm.add_argument("name")
    with_client(rm, cmd_rm)
    source = verbs.add_parser("source", help="show a function's uploaded files, or write them to a folder")
    source.add_argument("name")
    source.add_argument("--out", help="write the files into this folder instead of printing them")
    with_client(source, cmd_source)

    trigger = verbs.add_parser("trigger", help="http, cron and event triggers").add_subparsers(
        dest="trigger_verb", required=True)
    ls = trigger.add_parser("ls", help="list triggers")
    ls.add_argument("--function", help="only this function's")
    with_client(ls, cmd_trigger_ls)
    add = trigger.add_parser("add", help="create a trigger")
    add.add_argument("name")
    add.add_argument("--function", required=True)
    add.add_argument("--type", choices=("http", "cron", "event"), default="http")
    add.add_argument("--schedule", help="cron: 5-field expression")
    add.add_argument("--queue", help="event: the queue name (becomes <namespace>.<queue>)")
    add.add_argument("--delivery", choices=("at_most_once", "at_least_once"),
                     help="event: a call a crash interrupted is dead-lettered (at_most_once, the default) or made "
                          "again (at_least_once)")
    add.add_argument("--auth", choices=("none", "token"), help="http: require a token of this tenant")
    add.add_argument("--methods", help="http: only these methods reach the function, e.g. GET,POST (others: 405)")
    add.add_argument("--path", help="http: the path pattern below the function's URL it serves, e.g. /users/{id} "
                                    "(its parameters reach the handler in the event's _params)")
    add.add_argument("--cors-origin", action="append", dest="cors_origins", metavar="ORIGIN",
                     help="http: a browser origin allowed by CORS (https://app.example.com, or *), repeatable; "
                          "the other CORS settings through the API")
    add.add_argument("--disabled", action="store_true", help="create it disabled")
    with_client(add, cmd_trigger_add)
    for verb, enabled in (("enable", True), ("disable", False)):
        p = trigger.add_parser(verb, help=f"{verb} a trigger")
        p.add_argument("name")
        with_client(p, toggle(enabled))
    trm = trigger.add_parser("rm", help="delete a trigger")
    trm.add_argument("name")
    with_client(trm, cmd_trigger_rm)

    job = verbs.add_parser("job", help="one-shot runs of a function").add_subparsers(dest="job_verb", required=True)
    run = job.add_parser("run", help="run a job: create it, or run it again (next run_id)")
    run.add_argument("name")
    run.add_argument("--function", help="the function to run (needed when the job is new)")
    run.add_argument("--event", help="the JSON event the function gets")
    run.add_argument("--wait", type=float, default=0, help="wait up to this many seconds for the result")
    with_client(run, cmd_job_run)
    jls = job.add_parser("ls", help="list jobs")
    with_client(jls, cmd_job_ls)
    get = job.add_parser("get", help="a job's phase and result")
    get.add_argument("name")
    get.add_argument("--wait", type=float, default=0, help="wait up to this many seconds for it to finish")
    with_client(get, cmd_job_get)
    jrm = job.add_parser("rm", help="delete a job")
    jrm.add_argument("name")
    with_client(jrm, cmd_job_rm)
