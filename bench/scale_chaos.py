"""Chaos at scale (`python -m bench.scale_chaos`, `make bench-scale-chaos`): the chaos test's faults at the scale
bench's size. The real operator process and a real kube-apiserver, N LibvirtMachines over H in-memory hosts that
outlive a SIGKILL (bench/journaled_hosts.py), and, drawn from one seed: the operator SIGKILLed K times at random
moments (a fifth of them while it starts) and started again, machines created in bursts throughout, a tenth of them
deleted a moment after their creation (mid-create) and a tenth later, kube-apiserver SIGKILLed and restarted twice.

Then one operator run converges, and the run checks: every live machine provisioned with exactly one domain, on the
host its status names, of the UUID its identity gives; no domain and no volume on any host that is not a live
machine's; every deleted LibvirtMachine gone (no finalizer stuck); no domain created twice (every define that made a
domain is logged by the hosts, across every kill). Then every machine is deleted and every host must be empty. The
figures are printed and written to bench/results/<name>.json and .md; `--seed` replays a schedule (the system's own
timing is not the seed's to fix).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import dataclasses
import json
import logging
import os
import pathlib
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from bench import testbed
from bench.journaled_hosts import Journal, JournaledHost
from bench.memory_operator import BASE_VOLUME, bench_host
from bench.scale import CLUSTER, CONCURRENT_WRITES, NAMESPACE, SPEC, Bed
from capi_libvirt.api import meta
from capi_libvirt.core import naming
from capi_libvirt.kube import kubeconfig
from capi_libvirt.kube.client import ApiError, KubeClient, object_path
from capi_libvirt.reconcile.machine.state import machine_volumes

log = logging.getLogger("bench")
STARTING_SHARE, STARTING_LIFE_S, WORKING_LIFE_S = 0.2, (0.0, 1.5), (1.5, 5.0)
STARTUP_ESTIMATE_S = 2.0  # a start of the operator process here, only to spread the schedule over the kills
MID_CREATE_SHARE, LATER_SHARE = 0.1, 0.1


@dataclasses.dataclass
class Plan:
    seed: int
    lives: list[float]  # how long each operator run lives before its SIGKILL
    gaps: list[float]  # the pause after each SIGKILL
    create_at: dict[str, float]  # seconds from the start
    delete_at: dict[str, float]
    mid_create: set[str]
    apiserver_at: list[float]

    @classmethod
    def draw(cls, seed: int, machines: int, kills: int) -> Plan:
        rng = random.Random(seed)
        lives = [rng.uniform(*STARTING_LIFE_S) if rng.random() < STARTING_SHARE else rng.uniform(*WORKING_LIFE_S)
                 for _ in range(kills)]
        gaps = [rng.uniform(0.0, 0.3) for _ in range(kills)]
        span = sum(lives) + sum(gaps) + STARTUP_ESTIMATE_S * kills
        names = [f"m{index}" for index in range(machines)]
        bursts = sorted(rng.uniform(0.0, 0.6 * span) for _ in range(max(1, machines // 100)))
        create_at = {name: rng.choice(bursts) + rng.uniform(0.0, 5.0) for name in names}
        doomed = rng.sample(names, int(machines * (MID_CREATE_SHARE + LATER_SHARE)))
        mid_create = set(doomed[:int(machines * MID_CREATE_SHARE)])
        delete_at = {name: create_at[name] + (rng.uniform(0.0, 2.0) if name in mid_create else
                                              rng.uniform(5.0, 0.3 * span)) for name in doomed}
        return cls(seed, lives, gaps, create_at, delete_at, mid_create, [0.3 * span, 0.6 * span])


class Storm:
    """The bench's own API calls (Cluster API's part), each retried while the API server is down or restarting."""

    def __init__(self, bed: Bed, api: KubeClient) -> None:
        self.bed, self.api = bed, api
        self.uids: dict[str, str] = {}  # LibvirtMachine name -> UID (its identity)
        self.deleted: set[str] = set()
        self.kills = self.apiserver_restarts = 0
        self._apiserver = asyncio.Lock()  # one restart at a time (two may fall close together in a short plan)

    async def retrying(self, call: Callable[[], Awaitable[Any]], ok_statuses: tuple[int, ...] = ()) -> Any:
        deadline = time.monotonic() + 300
        while True:
            try:
                return await call()
            except ApiError as error:
                if error.status in ok_statuses:
                    return None
                if error.status < 500 and error.status != 429 and error.status != 403:
                    raise  # (a restarting API server answers 403 until its RBAC is loaded)
            except (TimeoutError, aiohttp.ClientError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the API server did not answer for 300 s")
            await asyncio.sleep(0.5)

    async def create(self, name: str) -> None:
        labels = {meta.CLUSTER_NAME_LABEL: CLUSTER}
        await self.retrying(lambda: self.api.request("POST", object_path("", "v1", "secrets", NAMESPACE), {
            "metadata": {"name": name, "labels": labels}, "type": "cluster.x-k8s.io/secret",
            "data": {"value": base64.b64encode(b"#cloud-config\n{}\n").decode(),
                     "format": base64.b64encode(b"cloud-config").decode()}}), ok_statuses=(409,))
        machines = object_path(meta.CAPI_GROUP, meta.CAPI_VERSION, "machines", NAMESPACE)
        await self.retrying(lambda: self.api.request("POST", machines, {
            "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Machine",
            "metadata": {"name": name, "labels": labels},
            "spec": {"clusterName": CLUSTER, "bootstrap": {"dataSecretName": name},
                     "infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtMachine", "name": name}}}),
            ok_statuses=(409,))
        machine = await self.retrying(lambda: self.api.request("GET", f"{machines}/{name}"))
        ours = object_path(meta.GROUP, meta.VERSION, "libvirtmachines", NAMESPACE)
        await self.retrying(lambda: self.api.request("POST", ours, {
            "apiVersion": meta.API_VERSION, "kind": "LibvirtMachine",
            "metadata": {"name": name, "labels": labels, "ownerReferences": [{
                "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Machine", "name": name,
                "uid": machine["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": SPEC}), ok_statuses=(409,))
        body = await self.retrying(lambda: self.api.request("GET", f"{ours}/{name}"))
        self.uids[name] = body["metadata"]["uid"]

    async def delete(self, name: str) -> None:
        path = object_path(meta.GROUP, meta.VERSION, "libvirtmachines", NAMESPACE, name)
        await self.retrying(lambda: self.api.request("DELETE", path), ok_statuses=(404,))
        self.deleted.add(name)

    async def listed(self) -> dict[str, dict]:
        path = object_path(meta.GROUP, meta.VERSION, "libvirtmachines", NAMESPACE)
        return {body["metadata"]["name"]: body for body in (await self.retrying(
            lambda: self.api.request("GET", path)))["items"]}

    async def kill_operator_over_and_over(self, plan: Plan) -> None:
        for life, gap in zip(plan.lives, plan.gaps, strict=True):
            await asyncio.to_thread(self.bed.spawn_operator)
            await asyncio.sleep(life)
            operator = self.bed.operator
            assert operator is not None
            operator.send_signal(signal.SIGKILL)
            await asyncio.to_thread(operator.wait)
            self.bed.operator = None
            self.kills += 1
            await asyncio.sleep(gap)

    async def at(self, seconds: float, started: float, action: Awaitable[None]) -> None:
        await asyncio.sleep(max(0.0, started + seconds - time.monotonic()))
        await action

    async def kill_apiserver(self) -> None:
        assert self.bed.plane is not None
        async with self._apiserver:
            await asyncio.to_thread(self.bed.plane.kill_and_restart_apiserver)
            self.apiserver_restarts += 1

    async def run(self, plan: Plan) -> None:
        started = time.monotonic()
        slots = asyncio.Semaphore(CONCURRENT_WRITES)

        async def create_then_maybe_delete(name: str) -> None:
            await self.at(plan.create_at[name], started, asyncio.sleep(0))
            async with slots:
                await self.create(name)
            if name in plan.delete_at:
                await self.at(plan.delete_at[name], started, asyncio.sleep(0))
                async with slots:
                    await self.delete(name)

        await asyncio.gather(self.kill_operator_over_and_over(plan),
                             *(self.at(moment, started, self.kill_apiserver()) for moment in plan.apiserver_at),
                             *(create_then_maybe_delete(name) for name in plan.create_at))


def host_contents(folder: pathlib.Path, latency_s: float) -> dict[str, JournaledHost]:
    """The hosts as the operator left them (read with the operator stopped)."""
    return Journal(folder).load(lambda name: bench_host(name, latency_s, kind=JournaledHost))  # type: ignore[arg-type,return-value]


def findings(hosts: dict[str, JournaledHost], live: dict[str, dict], storm: Storm) -> dict[str, Any]:
    """What the hosts and the API hold against what should be there: each list is a failure when not empty. `live`:
    the LibvirtMachines the API lists (one deleted but still listed is a stuck finalizer, and its domain a leak)."""
    stuck = sorted(storm.deleted & set(live))
    live = {name: body for name, body in live.items() if name not in storm.deleted}
    expected_domains = {naming.domain_uuid(storm.uids[name]): (name, (body.get("status") or {}).get("host"))
                        for name, body in live.items()}
    where: dict[str, list[str]] = collections.defaultdict(list)
    for host_name, host in hosts.items():
        for uuid in host.domains:
            where[uuid].append(host_name)
    expected_volumes = {(host, name_) for name, body in live.items()
                        for host in [(body.get("status") or {}).get("host")]
                        for name_ in machine_volumes(NAMESPACE, name, storm.uids[name], "default").all_names()}
    return {
        "not provisioned": sorted(name for name, body in live.items()
                                  if not ((body.get("status") or {}).get("initialization") or {}).get("provisioned")),
        "without exactly one domain on their host": sorted(
            name for uuid, (name, host) in expected_domains.items() if where.get(uuid) != [host]),
        "domains of no live machine": sorted(f"{host}/{uuid}" for uuid, hosts_ in where.items()
                                             if uuid not in expected_domains for host in hosts_),
        "volumes of no live machine": sorted(f"{host_name}/{volume}" for host_name, host in hosts.items()
                                             for pool in host.pools.values() for volume in pool.volumes
                                             if volume != BASE_VOLUME and (host_name, volume) not in expected_volumes),
        "deleted but not gone (finalizer stuck)": stuck,
    }


async def converge(storm: Storm, expect_live: set[str], timeout_s: float) -> tuple[float, dict[str, dict]]:
    """Until the API holds exactly the live machines, each provisioned (or the timeout: what is there then)."""
    started = time.monotonic()
    while True:
        listed = await storm.listed()
        done = set(listed) == expect_live and all(
            ((body.get("status") or {}).get("initialization") or {}).get("provisioned") for body in listed.values())
        if done or time.monotonic() - started > timeout_s:
            return time.monotonic() - started, listed
        await asyncio.sleep(2.0)


async def chaos(bed: Bed, plan: Plan, machines: int) -> dict[str, Any]:
    assert bed.plane is not None
    async with KubeClient(kubeconfig.from_kubeconfig(paths=[bed.plane.kubeconfig_path])) as api:
        storm = Storm(bed, api)
        started = time.monotonic()
        await storm.run(plan)
        storm_s = time.monotonic() - started
        live = set(plan.create_at) - storm.deleted
        log.info("chaos: storm over after %.0fs (%d kills, %d API server restarts); converging", storm_s,
                 storm.kills, storm.apiserver_restarts)
        await asyncio.to_thread(bed.start_operator)
        converge_s, listed = await converge(storm, live, 600 + 0.5 * machines)
        await asyncio.to_thread(bed.stop_operator)
        hosts = await asyncio.to_thread(host_contents, bed.workdir / "hosts", bed.latency_s)
        after_storm = findings(hosts, listed, storm)
        creations = Journal(bed.workdir / "hosts").creations()
        created_twice = sorted(uuid for uuid, count in collections.Counter(u for _, u in creations).items()
                               if count > 1)
        # Then every machine deleted: the hosts must be empty.
        await asyncio.to_thread(bed.start_operator)
        slots = asyncio.Semaphore(CONCURRENT_WRITES)

        async def delete(name: str) -> None:
            async with slots:
                await storm.delete(name)
        await asyncio.gather(*(delete(name) for name in live))
        cleanup_s, left = await converge(storm, set(), 600 + 0.5 * machines)
        await asyncio.to_thread(bed.stop_operator)
        emptied = findings(await asyncio.to_thread(host_contents, bed.workdir / "hosts", bed.latency_s), left, storm)
    return {
        "seed": plan.seed, "machines": machines, "hosts": bed.hosts, "latency_s": bed.latency_s,
        "operator_kills": storm.kills, "apiserver_restarts": storm.apiserver_restarts,
        "deleted_mid_create": len(plan.mid_create), "deleted_later": len(plan.delete_at) - len(plan.mid_create),
        "live_after_storm": len(live), "domains_created": len(creations), "created_twice": created_twice,
        "storm_s": storm_s, "converged_s": converge_s, "cleanup_s": cleanup_s,
        "after_storm": after_storm, "after_cleanup": emptied,
    }


def failures(result: dict[str, Any]) -> list[str]:
    found = [f"{what} after the storm: {items[:10]} ({len(items)})" for what, items in result["after_storm"].items()
             if items]
    found += [f"{what} after deleting all: {items[:10]} ({len(items)})" for what, items in
              result["after_cleanup"].items() if items]
    if result["created_twice"]:
        found.append(f"domains created twice: {result['created_twice'][:10]} ({len(result['created_twice'])})")
    return found


def table(result: dict[str, Any]) -> str:
    counts = {what: len(items) for what, items in {**result["after_storm"]}.items()}
    left = sum(len(items) for items in result["after_cleanup"].values())
    return "\n".join([
        "| seed | hosts | machines | operator SIGKILLs | API server restarts | deleted mid-create | deleted later | "
        "domains created | created twice | not provisioned | not exactly one domain | leaked domains | leaked volumes | "
        "stuck finalizers | left after deleting all | storm s | converged s | all deleted s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {result['seed']} | {result['hosts']} | {result['machines']} | {result['operator_kills']} | "
        f"{result['apiserver_restarts']} | {result['deleted_mid_create']} | {result['deleted_later']} | "
        f"{result['domains_created']} | {len(result['created_twice'])} | {counts['not provisioned']} | "
        f"{counts['without exactly one domain on their host']} | {counts['domains of no live machine']} | "
        f"{counts['volumes of no live machine']} | {counts['deleted but not gone (finalizer stuck)']} | {left} | "
        f"{result['storm_s']:.0f} | {result['converged_s']:.0f} | {result['cleanup_s']:.0f} |"]) + "\n"


def run(machines: int, hosts: int, kills: int, seed: int, latency_s: float, out: pathlib.Path, name: str) -> dict:
    plan = Plan.draw(seed, machines, kills)
    workdir = testbed.new_workdir()
    log.info("chaos at scale: seed %d, %d machines over %d hosts, %d operator kills; working in %s", seed, machines,
             hosts, kills, workdir)
    bed = Bed(workdir / "chaos", hosts, latency_s, journal=True)
    with bed.up(start=False):
        result = asyncio.run(chaos(bed, plan, machines))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{name}.md").write_text(table(result))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_chaos", description=__doc__)
    parser.add_argument("--machines", type=int, default=2000)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED") or random.randrange(2**32)))
    parser.add_argument("--latency", type=float, default=0.005, help="seconds a host operation takes")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    parser.add_argument("--name", default="scale-chaos")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    result = run(args.machines, args.hosts, args.kills, args.seed, args.latency, args.out, args.name)
    print(f"[chaos at scale] seed={result['seed']} machines={result['machines']} hosts={result['hosts']} "
          f"operator_kills={result['operator_kills']} apiserver_restarts={result['apiserver_restarts']} "
          f"deleted_mid_create={result['deleted_mid_create']} deleted_later={result['deleted_later']} "
          f"domains_created={result['domains_created']} created_twice={len(result['created_twice'])} "
          f"converged_s={result['converged_s']:.0f} all_deleted_s={result['cleanup_s']:.0f}")
    problems = failures(result)
    for problem in problems:
        print(f"[chaos at scale] FAILED (seed {result['seed']}): {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
