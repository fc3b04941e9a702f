"""The `capi-libvirt` command: run the operator, show a machine's console log, or generate manifests.

The local development environment (`make run`, `make demo`) is not part of the product: it is `python -m devenv`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pathlib
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
    from capi_libvirt.operator import config, election, logs, main

    manager = manager_config(args)
    logs.configure(manager.log_format or logs.default_format(),
                   verbose=args.verbose or args.run_verbose or manager.v >= config.DEBUG_VERBOSITY)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    operator_config = run_config(args)
    try:
        lease = manager.lease()
        metrics_address = manager.served_metrics_address()
    except ValueError as error:
        print(f"capi-libvirt run: {error}", file=sys.stderr)
        return 2
    for name, value in sorted(vars(args).items()):
        if name.startswith("unused_") and value is not None:
            log.warning("--%s=%s ignored: this provider serves no webhooks and no profiler",
                        name.removeprefix("unused_").replace("_", "-"), value)
    operator = main.run_operator(args.namespace, operator_config=operator_config, lease=lease,
                                 health_address=manager.health_address, metrics_address=metrics_address)
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


def manager_config(args: argparse.Namespace) -> config.ManagerConfig:
    """How the manager runs (leader election, endpoints, logs), from `run`'s arguments (operator.config)."""
    from capi_libvirt.operator import config

    return config.ManagerConfig(**{name: getattr(args, name) for name, _flag, _default in
                                   config.settings(config.ManagerConfig)})


def election_lease(args: argparse.Namespace) -> election.Lease | None:
    """The Lease the replicas elect their leader in; None: no election (--standalone, --leader-elect=false)."""
    return manager_config(args).lease()


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A setting's parser as argparse's `type`: its ValueError becomes the message argparse prints."""
    def read(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    read.__name__ = getattr(parse, "__name__", "value")
    return read


def _add_run_arguments(run: argparse.ArgumentParser) -> None:
    """The settings of `run` (operator.config: the manager's and the operator's, each spelled once there), and the
    flags the Cluster API Operator may write that this provider takes and ignores."""
    from capi_libvirt.operator import config

    groups: dict[str, Any] = {}
    for of in (config.ManagerConfig, config.OperatorConfig):
        for name, setting, default in config.settings(of):
            if setting.exclusive is not None and setting.exclusive not in groups:
                groups[setting.exclusive] = run.add_mutually_exclusive_group()
            where = run if setting.exclusive is None else groups[setting.exclusive]
            shown = "" if default is None else setting.shown(default)
            options: dict[str, Any] = {"dest": name, "help": setting.help.format(default=shown)}
            if setting.switch:
                options.update(action="store_const", const=True)
            else:
                options.update(type=_argument_type(setting.parse), metavar=setting.metavar)
                if setting.optional_value:
                    options.update(nargs="?", const=True)
            if of is config.OperatorConfig:  # not given: its environment variable, then its default (from_arguments)
                options["default"] = argparse.SUPPRESS
            else:
                options["default"] = setting.default_now() if setting.default_now else default
            where.add_argument(*setting.names, **options)
    for flag, what in (("--webhook-host", "HOST"), ("--webhook-port", "PORT"), ("--webhook-cert-dir", "DIR"),
                       ("--profiler-address", "HOST:PORT")):
        run.add_argument(flag, metavar=what, dest=f"unused_{flag[2:].replace('-', '_')}",
                         help="taken for the Cluster API Operator's sake and ignored with a warning: this provider "
                              "serves no webhooks and no Go profiler")
    run.add_argument("-v", "--verbose", dest="run_verbose", action="store_true", help="debug logging (as --v=4)")


def _cmd_console_log(args: argparse.Namespace) -> int:
    import aiohttp

    from capi_libvirt import console_log
    from capi_libvirt.hypervisor import errors
    from capi_libvirt.kube import api, kubeconfig
    from capi_libvirt.operator import config

    if not args.verbose:
        logging.getLogger().setLevel(logging.ERROR)  # stdout is the log; stderr only says what went wrong
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig

    async def show() -> None:
        static_hosts = config.from_arguments({}, args.host).hosts
        given = args.namespace if args.namespace or "/" in args.machine else kubeconfig.default_namespace(args.context)
        namespace, name = console_log.parse_machine_ref(args.machine, given)
        async with api.new_api_client(args.context) as api_client:
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
    except kubeconfig.KubeconfigError as error:
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
