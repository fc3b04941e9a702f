"""The real operator (`capi-libvirt run`, unchanged) whose hosts are in-memory hosts (devenv.memory_host), for the
scale bench: `python -m bench.memory_operator --latency SECONDS -- RUN-ARGS...`.

Every host the operator is given (`--host NAME=memory:///NAME`) or finds in a LibvirtHost object is a MemoryHost of
that name, made on first use with the bench machines' base volume, room for thousands of machines, and each
operation taking `--latency` seconds (a libvirt call's round trip, as `make bench` measures it on the real daemon).
Only the host registry's factory is swapped, from outside the product; the API client, the reconciles, the work
queue and the metrics are the product's own.
"""

from __future__ import annotations

import argparse
import functools
import sys

from capi_libvirt import cli
from capi_libvirt.hypervisor import host as host_api
from devenv.memory_host import MemoryHost, MemoryHosts
from devenv.memory_state import GIB

BASE_VOLUME = "bench-base.qcow2"
NETWORK = "default"
SUBNET = "198.18.0.0/16"  # leases for 65,000 machines; in memory only, nothing is ever sent to them


def bench_host(name: str, latency_s: float) -> MemoryHost:
    host = MemoryHost(name, cpus=4096, memory_mib=1 << 24, pools={"default": 1 << 60},
                      networks={NETWORK: SUBNET}, latency_s=latency_s)
    host.add_volume("default", BASE_VOLUME, b"QFI\xfb", capacity=1 * GIB, fmt="qcow2")
    host.keep_uploads = False  # the hosts live in the operator's process: their seeds' bytes are not its memory
    return host


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory_operator", description=__doc__)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds each host operation takes")
    parser.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then `capi-libvirt run`'s arguments")
    args = parser.parse_args(argv)
    hosts = MemoryHosts(make=functools.partial(bench_host, latency_s=args.latency))
    host_api.HostRegistry = functools.partial(host_api.HostRegistry, factory=hosts)  # type: ignore[assignment,misc]
    run_args = args.run_args[1:] if args.run_args[:1] == ["--"] else args.run_args
    return cli.main(["run", *run_args])


if __name__ == "__main__":
    sys.exit(main())
