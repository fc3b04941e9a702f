"""The real operator (`capi-libvirt run`, unchanged) whose hosts are in-memory hosts (devenv.memory_host), for the
scale bench: `python -m bench.memory_operator --latency SECONDS [--state FILE] -- RUN-ARGS...`.

Every host the operator is given (`--host NAME=memory:///NAME`) or finds in a LibvirtHost object is a MemoryHost of
that name, made on first use with the bench machines' base volume, room for thousands of machines, and each
operation taking `--latency` seconds (a libvirt call's round trip, as `make bench` measures it on the real daemon).
Only the host registry's factory is swapped, from outside the product; the API client, the reconciles, the work
queue and the metrics are the product's own. The hosts live in the operator's process; with `--state`, what they hold
(pools, networks and their leases, domains) is written to FILE when the operator stops (SIGTERM, as a Deployment's
rollout stops it) and read back when it starts, so a restart finds the hypervisors as it left them.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import pickle
import sys

from bench.journaled_hosts import Journal, JournaledHost
from capi_libvirt import cli
from capi_libvirt.hypervisor import host as host_api
from devenv.memory_host import MemoryHost, MemoryHosts
from devenv.memory_state import GIB

BASE_VOLUME = "bench-base.qcow2"
NETWORK = "default"
SUBNET = "198.18.0.0/16"  # leases for 65,000 machines; in memory only, nothing is ever sent to them


Saved = dict[str, tuple]  # host name -> (pools, networks, domains)


def bench_host(name: str, latency_s: float, saved: Saved | None = None,
               kind: type[MemoryHost] = MemoryHost) -> MemoryHost:
    host = kind(name, cpus=4096, memory_mib=1 << 24, pools={"default": 1 << 60},
                      networks={NETWORK: SUBNET}, latency_s=latency_s)
    if saved and name in saved:
        host.pools, host.networks, host.domains = saved[name]
    else:
        host.add_volume("default", BASE_VOLUME, b"QFI\xfb", capacity=1 * GIB, fmt="qcow2")
    # The hosts live in the operator's process: their seeds' bytes, and the log of every call asked of them with its
    # arguments (a test's hands), are not the operator's memory.
    host.keep_uploads = host.keep_asked = False
    return host


def journaled(folder: pathlib.Path, latency_s: float) -> MemoryHosts:
    """The hosts as the last run left them (snapshot and journal), each change from now on journaled."""
    journal = Journal(folder)
    make = functools.partial(bench_host, latency_s=latency_s, kind=JournaledHost)
    restored = journal.load(make)
    journal.start(restored)

    def made(name: str) -> MemoryHost:
        host = restored.pop(name, None) or make(name)
        assert isinstance(host, JournaledHost)
        host.journal = journal
        return host
    return MemoryHosts(make=made)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory_operator", description=__doc__)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds each host operation takes")
    parser.add_argument("--state", type=pathlib.Path, help="the hosts' state across a restart: read at start, "
                        "written when the operator stops")
    parser.add_argument("--journal", type=pathlib.Path, help="a folder where every host change is written as it "
                        "happens (bench/journaled_hosts.py): the hosts outlive a SIGKILL")
    parser.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then `capi-libvirt run`'s arguments")
    args = parser.parse_args(argv)
    saved: Saved = pickle.loads(args.state.read_bytes()) if args.state and args.state.exists() else {}
    hosts = journaled(args.journal, args.latency) if args.journal else \
        MemoryHosts(make=functools.partial(bench_host, latency_s=args.latency, saved=saved))
    host_api.HostRegistry = functools.partial(host_api.HostRegistry, factory=hosts)  # type: ignore[assignment,misc]
    run_args = args.run_args[1:] if args.run_args[:1] == ["--"] else args.run_args
    code = cli.main(["run", *run_args])
    if args.state:
        args.state.write_bytes(pickle.dumps({name: (host.pools, host.networks, host.domains)
                                             for name, host in hosts.hosts.items()}))
    return code


if __name__ == "__main__":
    sys.exit(main())
