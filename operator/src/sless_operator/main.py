"""``sless-operator``: run the Kopf operator (no Kopf peering: with ``SLESS_OPERATOR_LEADER_ELECTION``, replicas
take turns through a Lease, ``sless_operator.leader``; without it, run one replica at a time).

    sless-operator                      # every namespace (cluster-wide)
    sless-operator --namespace NS ...   # only these namespaces (plus the build namespace); globs
                                        # such as 'sless-*' match namespaces as they come

Configuration comes from the environment (see ``sless_operator.config``); the Kubernetes
credentials from the service account in a pod, else ``$KUBECONFIG`` (client certificates,
tokens). The official ``kubernetes`` client is kept out of the process: Kopf imports it when it
is installed, and it alone costs ~40 MB of RSS. Set ``SLESS_OPERATOR_OFFICIAL_CLIENT=1`` to
allow it, for kubeconfigs that need its exec or auth-provider plugins.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from sless_core.release import platform_version


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sless-operator", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("-n", "--namespace", action="append", default=[],
                        help="serve only this namespace (repeatable); default: all namespaces")  # fmt: skip
    parser.add_argument("--version", action="version", version=f"sless-operator {platform_version()}")
    parser.add_argument("--liveness", metavar="URL", help="serve a liveness probe, e.g. http://0.0.0.0:8081/healthz")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_true", help="log every handler")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    verbosity.add_argument("--debug", action="store_true", help="log API traffic too")
    return parser.parse_args(argv)


def watch_streams(namespaces: list[str]) -> int | None:
    """Kopf's long-lived watches: Function, Trigger, FunctionJob, Job, Deployment per namespace (+ CRDs and
    namespaces); None (no bound) for a pattern such as ``sless-*``, which matches namespaces as they come."""
    if any(mark in ns for ns in namespaces for mark in "*?!,"):
        return None
    return 5 * max(1, len(namespaces)) + 4


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from sless_core.envconfig import ConfigError
    from sless_operator.config import OperatorConfig

    try:
        config = OperatorConfig.from_env(os.environ)  # the one read of the environment
    except ConfigError as exc:
        print(f"sless-operator: {exc}", file=sys.stderr)
        return 2
    if not config.official_client:
        sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]  # import -> ImportError
    import kopf

    from sless_operator.context import Context

    kopf.configure(debug=args.debug, verbose=args.verbose, quiet=args.quiet, log_format=kopf.LogFormat.PLAIN)
    # which release runs, replica by replica during a rolling upgrade
    print(f"sless-operator {platform_version()} starting", file=sys.stderr, flush=True)
    import sless_operator.handlers  # noqa: F401  (registers the handlers)

    namespaces = list(dict.fromkeys([*args.namespace, config.build_namespace])) if args.namespace else []

    def run() -> None:
        kopf.run(
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            memo=Context(config, watch_streams=watch_streams(namespaces)),
            liveness_endpoint=args.liveness,
            # kopf's default identity asks getpass for the user name, which fails for a uid without a
            # passwd entry (the chart's 10001 on most images); standalone, it is only a name in logs
            identity=f"sless-operator@{socket.gethostname()}",  # type: ignore[arg-type]  # a str NewType kopf does not export
        )

    from sless_core import tracing

    # the spans of reconciles, jobs and cron firings (sless_operator.deploytrace): off unless OTEL_* ask
    tracing.configure("sless-operator", os.environ)
    try:
        if not config.leader_election:
            run()
            return 0
        from sless_operator.leader import run_elected

        # replicas take turns: only the Lease's holder runs Kopf (the others stand by)
        return run_elected(config.platform_namespace, config.lease_sec, config.official_client, run, args.liveness)
    finally:
        tracing.shutdown()  # what is buffered goes out before the process ends


if __name__ == "__main__":
    sys.exit(main())
