"""The `capi-libvirt` command: run the operator, show a machine's console log, or generate manifests.

The local development environment (`make run`, `make demo`) is not part of the product: it is `python -m devenv`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pathlib
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capi_libvirt.operator import config, election

log = logging.getLogger("capi_libvirt")


def _cmd_manifests(args: argparse.Namespace) -> int:
    from capi_libvirt.api import manifests

    directory = pathlib.Path(args.dir)
    if args.check:
        stale = manifests.differences(directory)
        if stale:
            print(f"generated manifests are out of date in {directory}: {', '.join(stale)}; run `make manifests`")
            return 1
        print(f"{directory}: up to date")
        return 0
    for path in manifests.write(directory):
        print(f"wrote {path}")
    return 0


def _cmd_templates(args: argparse.Namespace) -> int:
    from capi_libvirt.api import release

    return release.main(["templates", "--dir", args.dir, *(["--check"] if args.check else [])])


def _cmd_release_manifests(args: argparse.Namespace) -> int:
    from capi_libvirt.api import release

    return release.main(["write", "--out", args.out, "--version", args.version, "--config", args.config])


def _cmd_run(args: argparse.Namespace) -> int:
    from capi_libvirt.operator import election, logs, main

    logs.configure(args.log_format, verbose=args.verbose or args.run_verbose or args.v >= DEBUG_VERBOSITY)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    operator_config = run_config(args)
    try:
        lease = election_lease(args)
        metrics_address = _metrics_address(args)
    except ValueError as error:
        print(f"capi-libvirt run: {error}", file=sys.stderr)
        return 2
    for name, value in sorted(vars(args).items()):
        if name.startswith("unused_") and value is not None:
            log.warning("--%s=%s ignored: this provider serves no webhooks and no profiler",
                        name.removeprefix("unused_").replace("_", "-"), value)
    operator = main.run_operator(args.namespace, operator_config=operator_config, lease=lease,
                                 health_address=args.health_address, metrics_address=metrics_address)
    try:
        asyncio.run(operator)  # SIGTERM/SIGINT: kopf stops gracefully (it handles them in the main thread)
    except asyncio.CancelledError:  # how kopf ends its root task after a signal: a clean stop
        pass
    except election.LeadershipLost as error:  # the pod restarts and stands by, as controller-runtime's managers do
        log.error("leader election lost: %s", error)
        return 1
    return 0


def run_config(args: argparse.Namespace) -> config.OperatorConfig:
    """The operator's configuration from `run`'s arguments: the settings given, the rest from the environment or their
    defaults (operator.config)."""
    from capi_libvirt.operator import config

    given = {name: getattr(args, name) for name, _flag, _default in config.settings() if hasattr(args, name)}
    return config.from_arguments(given, args.host)


def election_lease(args: argparse.Namespace) -> election.Lease | None:
    """The Lease the replicas elect their leader in, in the provider's namespace; None: no election (--standalone,
    --leader-elect=false)."""
    from capi_libvirt.operator import config, election

    if args.standalone or not args.leader_elect:
        return None
    namespace, _, name = args.leader_election_id.rpartition("/")
    return election.Lease(name=name, namespace=namespace or config.provider_namespace(),
                          identity=election.new_identity(), duration_s=args.leader_elect_lease_duration,
                          renew_deadline_s=args.leader_elect_renew_deadline,
                          retry_period_s=args.leader_elect_retry_period)


def _metrics_address(args: argparse.Namespace) -> str:
    """--metrics-bind-addr, or --diagnostics-address when --insecure-diagnostics says plain HTTP is what is wanted:
    without it Cluster API's managers serve authenticated HTTPS, which this one does not, and it will not serve plain
    HTTP in its place."""
    if args.diagnostics_address is None:
        return str(args.metrics_address)
    if not args.insecure_diagnostics:
        raise ValueError("--diagnostics-address without --insecure-diagnostics asks for authenticated HTTPS metrics, "
                         "which this provider does not serve yet: add --insecure-diagnostics, or use "
                         "--metrics-bind-addr")
    return str(args.diagnostics_address)


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A setting's parser as argparse's `type`: its ValueError becomes the message argparse prints."""
    def read(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    read.__name__ = getattr(parse, "__name__", "value")
    return read


def _duration(value: str) -> float:
    from capi_libvirt.operator import config

    return _argument_type(config.duration)(value)


def _address(value: str) -> str:
    from capi_libvirt.operator import endpoints

    try:
        endpoints.parse_address(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


LEASE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def _lease_name(value: str) -> str:
    """NAME, or NAMESPACE/NAME as the Cluster API Operator writes it (from spec.manager.leaderElection)."""
    namespace, _, name = value.rpartition("/")
    if not LEASE_NAME.match(name) or (namespace and not LEASE_NAME.match(namespace)):
        raise argparse.ArgumentTypeError(f"lease {value!r}: expected NAME or NAMESPACE/NAME, lowercase DNS names")
    return value


FEATURE_GATES: dict[str, bool] = {}  # this provider has none yet; Cluster API's managers refuse unknown gates too


def _feature_gates(value: str) -> dict[str, bool]:
    gates = {}
    for entry in filter(None, (e.strip() for e in value.split(","))):
        name, sep, setting = entry.partition("=")
        if not sep or setting.lower() not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"feature gate {entry!r}: expected NAME=true or NAME=false")
        if name not in FEATURE_GATES:
            known = ", ".join(sorted(FEATURE_GATES)) or "none"
            raise argparse.ArgumentTypeError(f"unrecognized feature gate {name!r} (this provider's: {known})")
        gates[name] = setting.lower() == "true"
    return gates


DEBUG_VERBOSITY = 4  # Cluster API's managers log at debug from --v=4 on (klog's convention)


def _boolean(value: str) -> bool:
    """true or false, as Go's flag package reads a boolean flag's value (--leader-elect=false)."""
    words = {"true": True, "t": True, "1": True, "false": False, "f": False, "0": False}
    if value.lower() not in words:
        raise argparse.ArgumentTypeError(f"{value!r}: expected true or false")
    return words[value.lower()]


def _verbosity(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected a verbosity of 0 or more")
    return int(value)


def _log_format(value: str) -> str:
    from capi_libvirt.operator import logs

    chosen = {"text": logs.PLAIN}.get(value, value)  # Cluster API's name for it
    if chosen not in logs.FORMATS:
        raise argparse.ArgumentTypeError(f"{value!r}: expected json or text")
    return chosen


def _add_run_arguments(run: argparse.ArgumentParser) -> None:
    """Leader election, endpoints, concurrency and log format of `run` (the Deployment's args:
    config/manager/manager.yaml)."""
    from capi_libvirt.operator import config, logs
    from capi_libvirt.operator import election as election_

    election = run.add_mutually_exclusive_group()
    election.add_argument("--leader-election-id", "--peering", dest="leader_election_id",
                          default=election_.DEFAULT_LEASE_NAME, type=_lease_name, metavar="[NAMESPACE/]NAME",
                          help="the Lease (coordination.k8s.io; in the provider's namespace unless one is given) the "
                               f"replicas elect their leader in (default: {election_.DEFAULT_LEASE_NAME}; --peering: "
                               "its old name, deprecated)")
    election.add_argument("--standalone", action="store_true",
                          help="no leader election: run as if alone (development)")
    run.add_argument("--leader-elect", type=_boolean, nargs="?", const=True, default=True, metavar="BOOL",
                     help="Cluster API's flag: true (the default) elects a leader among the replicas over the Lease; "
                          "false runs as if alone, as --standalone")
    run.add_argument("--leader-elect-lease-duration", type=_duration, default=election_.DEFAULT_LEASE_DURATION_S,
                     metavar="DURATION", help="how long a standby waits for a silent leader before it takes over "
                     f"(default: {election_.DEFAULT_LEASE_DURATION_S:g}s)")
    run.add_argument("--leader-elect-renew-deadline", type=_duration, default=election_.DEFAULT_RENEW_DEADLINE_S,
                     metavar="DURATION", help="how long the leader keeps trying to renew before it gives up and exits "
                     f"(default: {election_.DEFAULT_RENEW_DEADLINE_S:g}s)")
    run.add_argument("--leader-elect-retry-period", type=_duration, default=election_.DEFAULT_RETRY_PERIOD_S,
                     metavar="DURATION", help="how often every replica tries to take or renew the Lease (default: "
                     f"{election_.DEFAULT_RETRY_PERIOD_S:g}s)")
    for name, setting, default in config.settings():  # the operator's own settings, each spelled once there
        run.add_argument(*setting.names, dest=name, type=_argument_type(setting.parse), metavar=setting.metavar,
                         default=argparse.SUPPRESS, help=setting.help.format(default=setting.shown(default)))
    run.add_argument("--feature-gates", type=_feature_gates, default={}, metavar="NAME=BOOL,...",
                     help="Cluster API's flag; this provider has no feature gates yet, and refuses unknown ones")
    for flag, what in (("--webhook-host", "HOST"), ("--webhook-port", "PORT"), ("--webhook-cert-dir", "DIR"),
                       ("--profiler-address", "HOST:PORT")):
        run.add_argument(flag, metavar=what, dest=f"unused_{flag[2:].replace('-', '_')}",
                         help="taken for the Cluster API Operator's sake and ignored with a warning: this provider "
                              "serves no webhooks and no Go profiler")
    run.add_argument("--health-addr", "--health-address", dest="health_address", default="0.0.0.0:8081",
                     type=_address, metavar="HOST:PORT",
                     help="serve /healthz and /readyz here (default: 0.0.0.0:8081; 0: off; --health-address: its old "
                          "name)")
    run.add_argument("--metrics-bind-addr", "--metrics-address", dest="metrics_address", default=":8080",
                     type=_address, metavar="HOST:PORT",
                     help="serve Prometheus /metrics here (default: :8080, every interface; 0: off; "
                          "--metrics-address: its old name)")
    run.add_argument("--diagnostics-address", type=_address, metavar="HOST:PORT",
                     help="Cluster API's newer name for the metrics address: taken only with --insecure-diagnostics "
                          "(plain HTTP, as --metrics-bind-addr); authenticated metrics are not served yet")
    run.add_argument("--insecure-diagnostics", type=_boolean, nargs="?", const=True, default=False, metavar="BOOL",
                     help="with --diagnostics-address: serve the metrics over plain HTTP without authentication")
    run.add_argument("--logging-format", "--log-format", dest="log_format", type=_log_format,
                     default=logs.default_format(), metavar="json|text",
                     help="json (one object per line) or text (default: json in a pod, text elsewhere; "
                          "--log-format and `plain`: the old names)")
    run.add_argument("--v", dest="v", type=_verbosity, default=0, metavar="LEVEL",
                     help="log verbosity, as Cluster API's managers take it: 0 (default) info, 4 and above debug")
    run.add_argument("-v", "--verbose", dest="run_verbose", action="store_true", help="debug logging (as --v=4)")


def _cmd_console_log(args: argparse.Namespace) -> int:
    import aiohttp
    from kubernetes_asyncio.config import ConfigException

    from capi_libvirt import console_log
    from capi_libvirt.hypervisor import errors
    from capi_libvirt.kube import api
    from capi_libvirt.operator import config

    if not args.verbose:
        logging.getLogger().setLevel(logging.ERROR)  # stdout is the log; stderr only says what went wrong
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig

    async def show() -> None:
        static_hosts = config.from_arguments({}, args.host).hosts
        given = args.namespace if args.namespace or "/" in args.machine else api.default_namespace(args.context)
        namespace, name = console_log.parse_machine_ref(args.machine, given)
        async with await api.new_api_client(args.context) as api_client:
            await console_log.show(api.KubeAPI(api_client), namespace, name, sys.stdout.buffer,
                                   static_hosts=static_hosts, tail_lines=args.tail, limit_bytes=args.limit_bytes,
                                   follow=args.follow)

    try:
        asyncio.run(show())
    except KeyboardInterrupt:  # how a --follow ends
        return 0
    except BrokenPipeError:  # piped into head and the like: they have read enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit
        return 0
    except (console_log.ConsoleLogError, errors.HypervisorError, ValueError) as error:
        print(f"capi-libvirt console-log: {error}", file=sys.stderr)
        return 1
    except ConfigException as error:
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        print(f"capi-libvirt console-log: no usable kubeconfig ({where}): {error}", file=sys.stderr)
        return 1
    except (TimeoutError, aiohttp.ClientError) as error:
        print(f"capi-libvirt console-log: Kubernetes API not reachable: {error}", file=sys.stderr)
        return 1
    return 0


def _lines(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected a number of lines of 0 or more")
    return int(value)


def _positive_bytes(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a number of bytes above 0")
    return number


def parser() -> argparse.ArgumentParser:
    from capi_libvirt import __version__

    top = argparse.ArgumentParser(prog="capi-libvirt", description=__doc__, allow_abbrev=False)
    top.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    top.add_argument("--version", action="version", version=f"capi-libvirt {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator against the cluster of the kubeconfig (or in-cluster)",
                         allow_abbrev=False)
    run.add_argument("--version", action="version", version=f"capi-libvirt {__version__}")
    run.add_argument("--namespace", action="append", default=[], help="watch only this namespace (repeatable)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    run.add_argument("--host", action="append", default=[], metavar="NAME=URI",
                     help="a libvirt host, e.g. kvm1=qemu+ssh://root@kvm1/system (repeatable; also $CAPI_LIBVIRT_HOSTS)")
    _add_run_arguments(run)
    run.set_defaults(func=_cmd_run)

    console = sub.add_parser("console-log", help="print a LibvirtMachine's serial console log, read from its host")
    console.add_argument("machine", metavar="NAME", help="the LibvirtMachine: NAME, or NAMESPACE/NAME")
    console.add_argument("-n", "--namespace", metavar="NAMESPACE",
                         help="the machine's namespace (default: the kubeconfig context's, else default)")
    console.add_argument("--tail", type=_lines, metavar="LINES", help="only the last LINES lines, as kubectl logs")
    console.add_argument("--limit-bytes", type=_positive_bytes, metavar="BYTES",
                         help="print at most BYTES bytes, then stop (a --follow too), as kubectl logs")
    console.add_argument("-f", "--follow", action="store_true",
                         help="keep printing what the guest writes (Ctrl-C ends)")
    console.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    console.add_argument("--context", metavar="NAME", help="the kubeconfig context to use (default: its current one)")
    console.add_argument("--host", action="append", default=[], metavar="NAME=URI",
                         help="reach host NAME at URI instead of through its LibvirtHost object (repeatable; also "
                              "$CAPI_LIBVIRT_HOSTS)")
    console.set_defaults(func=_cmd_console_log)

    manifests = sub.add_parser("manifests", help="generate the CRDs under config/crd from the API models")
    manifests.add_argument("--dir", default="config/crd", help="output folder (default: config/crd)")
    manifests.add_argument("--check", action="store_true", help="only report whether the folder is current")
    manifests.set_defaults(func=_cmd_manifests)

    cluster_templates = sub.add_parser("templates", help="write the cluster templates of every flavor and the "
                                       "ClusterClasses (the release's, committed under templates/)")
    cluster_templates.add_argument("--dir", default="templates", help="output folder (default: templates)")
    cluster_templates.add_argument("--check", action="store_true", help="only report whether the folder is current")
    cluster_templates.set_defaults(func=_cmd_templates)

    release_manifests = sub.add_parser(
        "release-manifests", help="write the clusterctl release (components, metadata, cluster template)")
    release_manifests.add_argument("--out", default="out", help="output folder (default: out); the files go to "
                                   "OUT/infrastructure-libvirt/VERSION/, a clusterctl local repository")
    release_manifests.add_argument("--version", required=True, help="release version, e.g. v0.1.0")
    release_manifests.add_argument("--config", default="config", help="the config/ folder (default: config)")
    release_manifests.set_defaults(func=_cmd_release_manifests)

    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose or getattr(args, "run_verbose", False) else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
