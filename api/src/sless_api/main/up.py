"""``sless up``: the platform standalone in the foreground, one process (API, backend, services)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from pathlib import Path

from sless_api.cli.client import CliError
from sless_api.cli.commands import ClientEnv, local_secret


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser], env: ClientEnv) -> None:
    """The ``up`` verb of the ``sless`` command."""
    up = verbs.add_parser("up", help="run the platform standalone in the foreground")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8090)
    up.add_argument("--data-dir", default=str(env.data_dir))
    up.add_argument("--single-tenant", action="store_true",
                    help="run functions without a sandbox (SLESS_SANDBOX=off): one trusted tenant only")
    up.set_defaults(run=cmd_up)


def cmd_up(args: argparse.Namespace) -> int:
    import uvicorn

    from sless_api.gateway.batchsched import batch_scheduling
    from sless_api.gateway.gcsettle import settle
    from sless_api.gateway.slowclients import guarded_protocol
    from sless_api.logsetup import configure_logging
    from sless_api.main.app import create_app
    from sless_api.main.config import ApiConfig
    from sless_api.stores.datadir import DataDirError, secure_data_dir
    from sless_api.stores.invocations import sqlite_path
    from sless_core.envconfig import ConfigError, EnvReader

    batch_scheduling()  # before the first thread or function process: they inherit it (gateway.batchsched)
    data_dir = Path(args.data_dir).resolve()
    # The command line's choices, over the environment: the config is parsed once, with them.
    overrides = {"SLESS_DATA_DIR": str(data_dir)}
    if args.single_tenant:
        overrides["SLESS_SANDBOX"] = "off"
    # A function in its own network namespace still reaches this API (to call /fn) on its own 127.0.0.1
    # (not when the port is the kernel's choice: 0).
    listed = os.environ.get("SLESS_SANDBOX_HOST_PORTS", "")
    overrides["SLESS_SANDBOX_HOST_PORTS"] = ",".join(filter(None, [listed, str(args.port) if args.port else ""]))
    env = EnvReader(os.environ)
    if not (env.optional("SLESS_JWT_PUBLIC_KEY") or env.optional("SLESS_JWKS_URL")):
        try:
            overrides["SLESS_JWT_SECRET"] = local_secret(data_dir, args.client_env.jwt_secret)
        except CliError as exc:  # the data dir is not private
            print(f"sless up: refusing to start: {exc}", file=sys.stderr)
            return 2
    try:
        config = ApiConfig.from_env(os.environ, overrides)
    except ConfigError as exc:
        print(f"sless up: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.logging)
    databases = [data_dir / "state.db"]
    if config.database_url.startswith("sqlite:///"):
        databases.append(sqlite_path(config.database_url))
    try:
        secure_data_dir(data_dir, databases)
    except DataDirError as exc:
        print(f"sless up: refusing to start: {exc}", file=sys.stderr)
        return 2
    limits = config.server
    try:  # before the banner: a port in use is said at once, and is all that is said
        listener = listening_socket(args.host, args.port)
    except OSError as exc:
        print(f"sless up: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    url = f"http://{args.host}:{listener.getsockname()[1]}"
    print(f"sless standalone: serving on {url} (data in {data_dir})", file=sys.stderr)
    print(f"  get a token:      sless token --sub you --data-dir {data_dir}", file=sys.stderr)
    print(f"  deploy a folder:  sless deploy examples/hello-python --url {url}", file=sys.stderr)
    print(f"  call it:          curl {url}/fn/<namespace>/hello-python", file=sys.stderr)
    # uvicorn re-raises the stop signal after its graceful shutdown; with these handlers in place the
    # re-raised signal is a no-op, so a drained, clean stop exits 0 (and a failed one does not).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    from sless_api.backends.standalone.host.sandbox import SandboxUnavailable
    from sless_api.backends.standalone.state import CorruptStateError

    try:
        app = create_app(config)
    except (SandboxUnavailable, CorruptStateError) as exc:  # say why, not a traceback
        listener.close()
        print(f"sless up: refusing to start: {exc}", file=sys.stderr)
        return 2
    server = uvicorn.Server(uvicorn.Config(
        app, log_level="warning", log_config=None, access_log=False, timeout_graceful_shutdown=30, lifespan="on",
        http=guarded_protocol(limits), timeout_keep_alive=limits.keep_alive_sec,
        # Every caller of `sless up` comes from loopback, which uvicorn trusts for X-Forwarded-For:
        # the proxy would then take a client's claimed address as the peer's.
        proxy_headers=False))
    settle()  # the platform as built is never scanned by the garbage collector again (gateway.gcsettle)
    server.run(sockets=[listener])  # what uvicorn.run does, on the socket bound above
    if not server.started:  # the app's start-up failed (uvicorn logged why)
        return 1
    print("sless standalone: stopped", file=sys.stderr)
    return 0


def listening_socket(host: str, port: int) -> socket.socket:
    """HOST:PORT bound (port 0: the kernel's choice); OSError when it cannot be, e.g. the port is in use."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a restart finds it free
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    return sock
