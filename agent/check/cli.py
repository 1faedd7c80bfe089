"""`istio-cni-agent check [--pre] [--json] [--kubeconfig FILE] [--context NAME] [-n NAMESPACE]`,
also `kubectl istio-cni check ...` (the console script `kubectl-istio_cni`): the cluster's checks
from an operator's machine. One line per check (PASS, WARN or FAIL, what was found), its details
and its fix below it; `--json` prints the list of checks instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from agent.check import result
from agent.check.cluster import Cluster, ReadError, Unreachable, connect
from agent.check.facts import DEFAULT_NAMESPACE, Facts
from agent.check.run import postinstall_checks, preinstall, unread

OK, FAILED, USAGE = 0, 1, 2
KUBECTL_PROG = "kubectl istio-cni"
EPILOG = f"""\
exit codes:
  {OK}  every check passes (warnings allowed)
  {FAILED}  a check fails (its line says the fix)
  {USAGE}  usage error, or the cluster cannot be reached with the kubeconfig (or it may read
     none of what the checks need)
"""


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Check a cluster for istio-cni: before install (--pre) or after.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--pre", action="store_true", help="the checks before install")
    p.add_argument("--json", action="store_true", help="print the checks as a JSON list")
    p.add_argument("--kubeconfig", metavar="FILE", help="default: $KUBECONFIG, ~/.kube/config")
    p.add_argument("--context", metavar="NAME", help="the kubeconfig's context to use")
    p.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help=f"the chart's namespace (--pre: default {DEFAULT_NAMESPACE}; after install: any)",
    )
    p.add_argument("--config", metavar="FILE", help="accepted as by every subcommand; unused")
    return p


def main(
    command: str = "check",
    argv: Sequence[str] | None = None,
    *,
    prog: str = "istio-cni-agent check",
    cluster: Cluster | None = None,
    out: TextIO | None = None,
) -> int:
    """`cluster`: read this one instead of connecting with the kubeconfig (tests)."""
    out = out or sys.stdout
    try:
        args = parser(prog).parse_args(list(sys.argv[2:] if argv is None else argv))
    except SystemExit as e:
        return OK if e.code == 0 else USAGE
    own = cluster is None
    try:
        if cluster is None:
            cluster = connect(args.kubeconfig, args.context)
        facts = Facts(cluster, args.namespace)
        facts.version()  # reachable at all?
        results = preinstall(facts) if args.pre else postinstall_checks(facts)
    except (Unreachable, ReadError) as e:
        sys.stderr.write(f"{prog}: cannot reach the cluster: {e}\n")
        return USAGE
    finally:
        close = getattr(cluster, "close", None)
        if own and close is not None:
            close()
    out.write(result.as_json(results) if args.json else result.text(results))
    if unread(results):
        sys.stderr.write(f"{prog}: the kubeconfig's user could read none of what the checks need\n")
        return USAGE
    return FAILED if result.worst(results) == result.FAIL else OK


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """`kubectl-istio_cni`: kubectl runs it for `kubectl istio-cni ARGS`."""
    args = list(sys.argv[1:] if argv is None else argv)
    usage = f"usage: {KUBECTL_PROG} check [--pre] [--json] [--kubeconfig FILE] [-n NS]\n"
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(usage)
        return OK if args else USAGE
    if args[0] != "check":
        sys.stderr.write(f"{KUBECTL_PROG}: unknown command {args[0]!r}\n{usage}")
        return USAGE
    return main("check", args[1:], prog=f"{KUBECTL_PROG} check")
