"""The ``sless`` command: run the platform standalone, mint development tokens, deploy and call functions."""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import sys
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sless_api.cli import calls as clicalls
from sless_api.cli import env as clienv
from sless_api.cli import invoke as cliinvoke
from sless_api.cli import queues as cliqueues
from sless_api.cli import scaffold as cliscaffold
from sless_api.cli import secrets as clisecrets
from sless_api.cli import stack as clistack
from sless_api.cli import verbs as cliverbs
from sless_api.cli import versions as cliversions
from sless_api.cli.client import Client, CliError, emit, table
from sless_api.cli.folders import read_manifest, wait_for_build, zip_folder
from sless_core.release import platform_version

DEFAULT_URL = "http://127.0.0.1:8090"


@dataclass(frozen=True)
class ClientEnv:
    """What the ``sless`` command takes from its environment, read once by its entry point (``main.sless``)."""

    url: str = DEFAULT_URL  # SLESS_URL
    token: str = ""  # SLESS_TOKEN: used as it is; else a token is signed with the data dir's secret
    sub: str = "developer"  # SLESS_SUB: the subject of that token
    data_dir: Path = Path.home() / ".local/share/sless"  # SLESS_DATA_DIR
    jwt_secret: str = ""  # SLESS_JWT_SECRET: the HS256 secret, instead of the data dir's
    jwt_issuer: str | None = None  # SLESS_JWT_ISSUER
    jwt_audience: str | None = None  # SLESS_JWT_AUDIENCE

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ClientEnv:
        return cls(url=env.get("SLESS_URL") or DEFAULT_URL, token=env.get("SLESS_TOKEN", ""),
                   sub=env.get("SLESS_SUB") or "developer",
                   data_dir=Path(env.get("SLESS_DATA_DIR") or Path.home() / ".local/share/sless"),
                   jwt_secret=env.get("SLESS_JWT_SECRET", "").strip(), jwt_issuer=env.get("SLESS_JWT_ISSUER"),
                   jwt_audience=env.get("SLESS_JWT_AUDIENCE"))  # fmt: skip


def local_secret(data_dir: Path, configured: str = "") -> str:
    """The HS256 secret of a standalone install: CONFIGURED (SLESS_JWT_SECRET), else one generated once per data
    dir."""
    if configured:
        return configured
    path = data_dir / "jwt-secret"
    if not path.exists():
        from sless_api.stores.datadir import DataDirError, secure_data_dir

        try:
            secure_data_dir(data_dir)  # a new data dir is private from the start (0700)
        except DataDirError as exc:
            raise CliError(str(exc)) from None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


def cmd_token(args: argparse.Namespace) -> int:
    from sless_api.auth import issue_token

    env: ClientEnv = args.client_env
    secret = local_secret(Path(args.data_dir), env.jwt_secret)
    extra = {"sless_admin": True} if args.admin else None
    print(issue_token(secret, args.sub, args.ttl, issuer=env.jwt_issuer, audience=env.jwt_audience, extra=extra))
    return 0


def client_from(args: argparse.Namespace) -> Client:
    from sless_api.auth import issue_token
    from sless_core.errors import ValidationError
    from sless_core.naming import validate_namespace

    if args.namespace is not None:
        try:
            validate_namespace(args.namespace, "--namespace")
        except ValidationError as exc:
            raise CliError(str(exc)) from None
    env: ClientEnv = args.client_env
    token = env.token or issue_token(local_secret(Path(args.data_dir), env.jwt_secret), args.sub, 3600)
    return Client(args.url, token, args.namespace)


def cmd_deploy(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    if not folder.is_dir():
        raise CliError(f"{folder} is not a folder: deploy uploads a folder of code")
    archive = zip_folder(folder)  # before anything is created: an upload that cannot happen creates nothing
    if not any(info.filename != "sless.json" for info in zipfile.ZipFile(io.BytesIO(archive)).infolist()):
        raise CliError(f"{folder} has no code to deploy (no file besides sless.json)")
    manifest = read_manifest(folder)
    name = args.name or manifest.pop("name", None) or folder.resolve().name
    trigger = manifest.pop("trigger", {"type": "http"})
    client = client_from(args)
    client.request("POST", client.ns_path("/ensure"))
    spec = {"name": name, **manifest}
    created = client.request("POST", client.ns_path("/functions"), json=spec, ok=(201, 409))
    if created is None or created.get("error"):
        client.request("PUT", client.ns_path(f"/functions/{name}"), json=manifest)
    print(f"uploading {len(archive)} bytes of code for {name}...", file=sys.stderr)
    client.request("POST", client.ns_path(f"/functions/{name}/upload"), files={"code": ("code.zip", archive)})
    if trigger:
        client.request("POST", client.ns_path("/triggers"), json={"name": name, "function": name, **trigger},
                       ok=(201, 409))
    record = wait_for_build(client, name, args.wait)
    url = f"{client.url}/fn/{client.namespace()}/{name}"
    if args.output == "json":
        print(json.dumps({"name": name, "phase": record["phase"], "url": url, "message": record["message"]}))
    elif record["phase"] == "Ready":
        print(f"{name}: Ready at {url}")
    else:
        print(f"{name}: {record['phase']}: {record['message']}")
    return 0 if record["phase"] == "Ready" else 1


LS_HEADER = ("NAME", "RUNTIME", "PHASE", "SCALE", "MESSAGE")


def cmd_ls(args: argparse.Namespace, client: Client) -> int:
    items = client.items("/functions")
    if args.quiet:
        sys.stdout.write("".join(f"{fn['name']}\n" for fn in items))
        return 0
    emit({"items": items}, args.output == "json", table(LS_HEADER, (ls_row(fn) for fn in items)))
    return 0


def ls_row(fn: dict[str, Any]) -> tuple[str, ...]:
    """One line per function, whatever its message holds (a build log tail has many lines)."""
    return (fn["name"], fn["runtime"], fn["phase"], cliverbs.scale_short(fn.get("scale")),
            cliverbs.one_line(fn.get("message"), 60) or "-")


#: adds verbs the client does not implement itself (``sless up``: the platform, from ``main.up``)
Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]", ClientEnv], None]


def parser(env: ClientEnv, extra: Sequence[Registrar] = ()) -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="sless", description="sless: serverless functions, self-hosted")
    root.add_argument("--version", action="version", version=f"sless {platform_version()}")
    verbs = root.add_subparsers(dest="verb", required=True)
    for register in extra:
        register(verbs, env)
    token = verbs.add_parser("token", help="print a token signed with the configured HS256 secret")
    token.add_argument("--sub", default=env.sub,
                       help="the token's subject, whose tenant it is (default: SLESS_SUB, else developer: the "
                            "tenant the other verbs use)")
    token.add_argument("--ttl", type=int, default=3600)
    token.add_argument("--admin", action="store_true", help="may cross namespaces")
    token.add_argument("--data-dir", default=str(env.data_dir))
    token.set_defaults(run=cmd_token)

    def client_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--url", default=env.url)
        p.add_argument("--sub", default=env.sub,
                       help="subject of the locally signed token (ignored when SLESS_TOKEN is set)")
        p.add_argument("--data-dir", default=str(env.data_dir))
        p.add_argument("--namespace", "-n", default=None,
                       help="the tenant namespace (default: the token's own); another tenant's is refused (403) "
                            "unless the token is an admin's")
        p.add_argument("--output", "-o", choices=("table", "json"), default="table",
                       help="json: the API's own JSON, for scripts")

    def with_client(p: argparse.ArgumentParser, verb: cliverbs.Verb) -> None:
        client_args(p)
        p.set_defaults(run=lambda args: verb(args, client_from(args)))

    deploy = verbs.add_parser("deploy", help="zip a folder, create or update the function, upload, wait")
    deploy.add_argument("folder")
    deploy.add_argument("--name")
    deploy.add_argument("--wait", type=float, default=600)
    client_args(deploy)
    deploy.set_defaults(run=cmd_deploy)
    cliinvoke.register(verbs, with_client)
    logs = verbs.add_parser("logs", help="recent invocations of a function (--follow: keep printing new ones, each "
                                         "with what it wrote; --id N: what call N wrote)")
    logs.add_argument("name")
    logs.add_argument("--id", type=int, default=None, help="an invocation's id (first column): print its output")
    logs.add_argument("--limit", type=int, default=20)
    logs.add_argument("--follow", "-f", action="store_true")
    logs.add_argument("--interval", type=float, default=1.0, help="--follow: seconds between polls")
    logs.add_argument("--no-output", action="store_true", help="--follow: the records only, not what each call wrote")
    with_client(logs, cliverbs.cmd_logs)
    ls = verbs.add_parser("ls", help="list functions")
    ls.add_argument("--quiet", "-q", action="store_true", help="only the names, one per line (for scripts)")
    with_client(ls, cmd_ls)
    cliverbs.register(verbs, with_client)
    clisecrets.register(verbs, with_client)
    cliversions.register(verbs, with_client)
    clicalls.register(verbs, with_client)
    clienv.register(verbs, with_client)
    cliqueues.register(verbs, with_client)
    clistack.register(verbs, with_client)
    cliscaffold.register(verbs)
    completion = verbs.add_parser("completion", help="print a shell completion script: eval \"$(sless completion "
                                                     "bash)\", source <(sless completion zsh), sless completion "
                                                     "fish | source")
    completion.add_argument("shell", choices=SHELLS)
    completion.set_defaults(run=lambda args: print_completion(root, args.shell))
    return root


#: The exit status of a process killed by SIGPIPE (128 + 13), which shells and `set -o pipefail` know.
SIGPIPE_EXIT = 141


def stdout_gone() -> None:
    """Point stdout at /dev/null: what is still buffered for a reader that left must not fail again, with a
    message on stderr, when the interpreter flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


SHELLS = ("bash", "zsh", "fish")


def print_completion(root: argparse.ArgumentParser, shell: str) -> int:
    from sless_api.cli.completion import SCRIPTS

    sys.stdout.write(SCRIPTS[shell](root))
    return 0


def main(argv: list[str] | None, env: ClientEnv, extra: Sequence[Registrar] = ()) -> int:
    """Run the verb ARGV names with ENV; EXTRA registers the verbs of other layers (the composition root passes
    ``up``)."""
    args = parser(env, extra).parse_args(argv)
    args.client_env = env
    try:
        code: int = args.run(args)
    except CliError as exc:
        print(f"sless: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader left (`sless ls | head`): stop quietly, as a tool killed by SIGPIPE does
        stdout_gone()
        return SIGPIPE_EXIT
    except OSError as exc:  # requests' connection errors are OSErrors: one line, not a traceback
        print(f"sless: cannot reach the API ({type(exc).__name__}): is `sless up` running at --url?",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code

