"""Chaos, reproducible by seed: machines created and deleted concurrently (some mid-create) while the operator process
is SIGKILLed from outside at 50 random moments and started again, and the libvirt host's libvirtd and kube-apiserver
are SIGKILLed and restarted mid-flight; then once more (libvirtd, kube-apiserver, a last wave of machines) under one
operator run that must live through it. At the end every live LibvirtMachine has exactly one domain (its UUID, its
owner metadata) and its volumes, every deleted one left nothing (domain, overlay, NoCloud ISO, serial log) and its
object is gone (no finalizer stuck), and no domain was defined twice (a libvirt lifecycle-event watch counts every
definition per UUID, across the libvirtd restarts). Then the live ones are deleted and the host must be empty.

The seed (CHAOS_SEED, random when unset) fixes the schedule: when each machine is created and deleted, when each
operator run gets its SIGKILL, when libvirtd and kube-apiserver die. It is printed first, and every failing
assertion names it; `CHAOS_SEED=<seed> pytest -m e2e -k chaos -s` replays the schedule (the system's own timing is
not the seed's to fix). Its own API server and libvirt host (subnet 192.168.170.0/24), so killing them disturbs no
other test. The guest is Debian's iPXE image (devenv/ipxe_image.py): it boots in a second and takes a lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import time

import aiohttp
import pytest
from kubernetes_asyncio import client, config

from capi_libvirt.api import meta
from capi_libvirt.core import domain_owner, naming, provider_id
from capi_libvirt.hypervisor import machines
from capi_libvirt.reconcile.machine import FINALIZER
from devenv import capi_objects, ipxe_image, paths
from devenv import control_plane as cp
from devenv.chaos_plan import KILLS, Plan, Stage, chaos_seed
from devenv.domain_events import DomainEvents
from devenv.libvirt_host import LibvirtHost
from devenv.operator_process import OperatorProcess

from fixtures_control_plane import OPERATOR_USER, REPO, allow_secrets, bind_operator_role
from fixtures_libvirt import require_libvirt_host_prerequisites
from prereq import require

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

HOST, SUBNET = "chaos", "192.168.170.0/24"
NAMESPACE = CLUSTER = "chaos"
READY_LINE, READY_TIMEOUT_S = "connected to host", 20.0  # an operator run works: it reached the libvirt host
CONVERGE_S = 300.0


async def retrying(call, what: str, deadline_s: float = 120.0):
    """An API call of the test's own (Cluster API's part), retried while the API server is down or restarting."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await call()
        except client.exceptions.ApiException as error:
            if error.status not in (0, 429, 500, 502, 503, 504) or time.monotonic() > deadline:
                raise
        except (TimeoutError, aiohttp.ClientError, OSError):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: the API server did not come back within {deadline_s:.0f}s") from None
        await asyncio.sleep(0.3)


async def tolerating(coroutine, *statuses: int):
    try:
        return await coroutine
    except client.exceptions.ApiException as error:
        if error.status not in statuses:
            raise
        return None


async def create_machine(api: client.ApiClient, name: str, spec: dict) -> None:
    """Bootstrap Secret, Machine, owned LibvirtMachine, as Cluster API makes them; each step survives a restarting
    API server (an object already there counts as made)."""
    objects = client.CustomObjectsApi(api)
    await retrying(lambda: tolerating(capi_objects.create_bootstrap_secret(
        api, NAMESPACE, CLUSTER, f"{name}-bootstrap", "#cloud-config\n"), 409), f"secret {name}")
    machine_body = capi_objects.machine_body(CLUSTER, name)
    await retrying(lambda: tolerating(objects.create_namespaced_custom_object(
        meta.CAPI_GROUP, meta.CAPI_VERSION, NAMESPACE, "machines", machine_body), 409), f"machine {name}")
    machine = await retrying(lambda: objects.get_namespaced_custom_object(
        meta.CAPI_GROUP, meta.CAPI_VERSION, NAMESPACE, "machines", name), f"machine {name}")
    body = capi_objects.libvirt_machine_body(CLUSTER, name, machine["metadata"]["uid"], spec)
    await retrying(lambda: tolerating(objects.create_namespaced_custom_object(
        meta.GROUP, meta.VERSION, NAMESPACE, "libvirtmachines", body), 409), f"libvirtmachine {name}")


async def delete_machine(api: client.ApiClient, name: str) -> None:
    """What Cluster API's Machine controller does first when a Machine is deleted: delete its infrastructure machine."""
    objects = client.CustomObjectsApi(api)
    await retrying(lambda: tolerating(objects.delete_namespaced_custom_object(
        meta.GROUP, meta.VERSION, NAMESPACE, "libvirtmachines", name), 404), f"delete {name}")


async def at(start: float, offset: float) -> None:
    await asyncio.sleep(max(0.0, start + offset - time.monotonic()))


@dataclasses.dataclass
class Tally:
    kills: int = 0
    kills_while_working: int = 0
    kills_in_flight: int = 0
    operator_starts: int = 0
    libvirtd_restarts: int = 0
    apiserver_restarts: int = 0
    checks: int = 0
    leaks: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    def check(self, ok: bool, problem: str) -> None:
        self.checks += 1
        if not ok:
            self.problems.append(problem)

    def leak(self, ok: bool, what: str) -> None:
        self.checks += 1
        if not ok:
            self.leaks.append(what)


def host_inventory(host: LibvirtHost) -> tuple[list[tuple[str, domain_owner.Owner | None]], set[str]]:
    """Every domain (UUID, owner metadata) and every volume of the pool (refreshed: files libvirt did not make count)."""
    with host.connect() as conn:
        domains = [(d.UUIDString(), domain_owner.parse_owner(d.XMLDesc(0))) for d in conn.listAllDomains()]
        pool = conn.storagePoolLookupByName(host.pool_name)
        pool.refresh(0)
        volumes = set(pool.listVolumes())
    return domains, volumes


def judge_host(tally: Tally, host: LibvirtHost, live: dict[str, dict], deleted: dict[str, str]) -> None:
    """live: name -> LibvirtMachine; deleted: name -> the UID it had (read when it was created)."""
    domains, volumes = host_inventory(host)
    for name, body in live.items():
        uid = naming.identity_uid(body)
        owned = [(uuid, owner) for uuid, owner in domains if owner is not None and owner.uid == uid]
        tally.check(len(owned) == 1, f"{name}: {len(owned)} domains carry its UID")
        tally.check(bool(owned) and owned[0][0] == naming.domain_uuid(uid), f"{name}: domain UUID is not its own")
        tally.check(bool(owned) and (owned[0][1].namespace, owned[0][1].name) == (NAMESPACE, name),
                    f"{name}: owner metadata names another machine")
        recorded = provider_id.parse_provider_id(body["spec"].get("providerID") or "chaos://none/none")
        tally.check(recorded.domain_uuid == naming.domain_uuid(uid), f"{name}: providerID names another domain")
        for volume in (naming.overlay_volume_name(NAMESPACE, name, uid), naming.nocloud_volume_name(NAMESPACE, name, uid),
                       naming.serial_log_file_name(NAMESPACE, name, uid)):
            tally.check(volume in volumes, f"{name}: volume {volume} missing")
        tally.check(body["metadata"].get("finalizers", []).count(FINALIZER) == 1, f"{name}: finalizer not exactly once")
        tally.check(not body["metadata"].get("deletionTimestamp"), f"{name}: being deleted")
    for name, uid in deleted.items():
        tally.leak(not any(owner is not None and owner.uid == uid for _, owner in domains), f"{name}: domain left")
        tally.leak(not any(u == naming.domain_uuid(uid) for u, _ in domains), f"{name}: domain of its UUID left")
        for volume in (naming.overlay_volume_name(NAMESPACE, name, uid), naming.nocloud_volume_name(NAMESPACE, name, uid),
                       naming.serial_log_file_name(NAMESPACE, name, uid)):
            tally.leak(volume not in volumes, f"{name}: volume {volume} left")
    live_uids = {naming.identity_uid(body) for body in live.values()}
    for uuid, owner in domains:
        tally.leak(owner is not None and owner.uid in live_uids, f"stray domain {uuid} (owner {owner})")
    expected = {ipxe_image.BASE_VOLUME} | {v for name, body in live.items() for v in (
        naming.overlay_volume_name(NAMESPACE, name, naming.identity_uid(body)),
        naming.nocloud_volume_name(NAMESPACE, name, naming.identity_uid(body)),
        naming.serial_log_file_name(NAMESPACE, name, naming.identity_uid(body)))}
    for volume in sorted(volumes - expected):
        tally.leak(False, f"stray volume {volume}")


async def test_chaos_kills_and_restarts_leave_one_domain_per_machine_and_nothing_else(tmp_path: pathlib.Path) -> None:
    seed = chaos_seed()
    print(f"\n[chaos] seed={seed} (replay: CHAOS_SEED={seed} pytest -m e2e -k chaos -s)")
    require_libvirt_host_prerequisites()
    require(ipxe_image.IPXE_ISO.exists(), f"{ipxe_image.IPXE_ISO} (Debian's ipxe package, make system-deps)")
    for binary in (paths.etcd_binary(), paths.kube_apiserver_binary(), paths.kubeadm_binary()):
        require(binary.exists(), f"{binary} (make upstream)")
    plan = Plan.draw(seed)
    tally = Tally()
    (tmp_path / "control-plane").mkdir()
    plane = cp.LocalControlPlane(workdir=tmp_path / "control-plane", users=[OPERATOR_USER],
                                 crd_dirs=[REPO / "config" / "crd", paths.cluster_api_crd_dir()])
    with plane, LibvirtHost(HOST, SUBNET, dnsmasq_options=["no-ping"], log_dir=tmp_path / "libvirt-logs") as host:
        bind_operator_role(plane)
        with host.connect() as conn:
            ipxe_image.upload_base(conn, host.pool_name, ipxe_image.ipxe_qcow2(tmp_path))
        configuration = client.Configuration()
        await config.load_kube_config(config_file=str(plane.kubeconfig_path), client_configuration=configuration)
        watch = DomainEvents(host.uri).start()
        operator = OperatorProcess(plane.kubeconfig_for(OPERATOR_USER), {HOST: host.uri}, tmp_path / "operator.log")
        try:
            async with client.ApiClient(configuration) as api:
                await client.CoreV1Api(api).create_namespace(client.V1Namespace(
                    metadata=client.V1ObjectMeta(name=NAMESPACE)))
                allow_secrets(plane, NAMESPACE)  # the bootstrap Secrets' namespace, as a user binds it
                await capi_objects.create_cluster(api, NAMESPACE, CLUSTER)
                uids: dict[str, str] = {}
                await run_stage(plan.storm, tally, api, host, plane, uids,
                                kill_operator_again_and_again(plan, tally, api, operator))
                await operator.start()
                starts = operator.starts
                assert await operator.logged(READY_LINE, READY_TIMEOUT_S), f"seed={seed}: the operator did not start"
                await run_stage(plan.survivor, tally, api, host, plane, uids)
                live, deleted = await converge(plan, api, uids, host)
                tally.check(operator.starts == starts and operator.process is not None and
                            operator.process.returncode is None, "the survivor did not survive")
                await operator.stop()
                await asyncio.to_thread(judge_host, tally, host, live, deleted)
                duplicates = watch.duplicates()
                tally.checks += len(watch.defined)
                # Then the live ones go too, with the operator back: the host ends clean.
                await operator.start()
                for name in live:
                    await delete_machine(api, name)
                await wait_gone(api, set(live), seed)
                await operator.stop()
                await asyncio.to_thread(judge_host, tally, host, {}, {**deleted, **{
                    name: naming.identity_uid(body) for name, body in live.items()}})
        finally:
            await operator.stop()
            watch.stop()
    # kopf logs a handler that raised and goes on: under chaos that is a bug of ours, never an expected fault.
    handler_failures = [line for line in (tmp_path / "operator.log").read_text(errors="replace").splitlines()
                        if "Handler '" in line and "failed" in line]
    tally.check(not handler_failures, f"{len(handler_failures)} handler failures, e.g. {handler_failures[:1]}")
    created = sum(len(stage.create_at) for stage in plan.stages)
    deleted_n = sum(len(stage.delete_at) for stage in plan.stages)
    print(f"[chaos] seed={seed} machines={created} deleted={deleted_n} "
          f"(mid-create {sum(len(stage.mid_create) for stage in plan.stages)}) live={created - deleted_n} "
          f"kills={tally.kills} (after the run reached the libvirt host: {tally.kills_while_working}; "
          f"with machines in flight: {tally.kills_in_flight}) "
          f"operator_starts={operator.starts} libvirtd_restarts={tally.libvirtd_restarts} "
          f"apiserver_restarts={tally.apiserver_restarts} domains_defined={sum(watch.defined.values())} "
          f"event_watch_reconnects={watch.reconnects} invariants_checked={tally.checks} leaks={len(tally.leaks)} "
          f"duplicates={len(duplicates)} problems={len(tally.problems)} "
          f"operator_exits_of_its_own={len(operator.exits_of_its_own)}")
    assert tally.kills >= KILLS and tally.libvirtd_restarts == 2 and tally.apiserver_restarts == 2, f"seed={seed}"
    assert not tally.leaks, f"seed={seed}: leaks {tally.leaks}"
    assert not duplicates, f"seed={seed}: domains defined more than once {duplicates}"
    assert not watch.seen_by_listing, f"seed={seed}: domains defined while the event watch was down " \
                                      f"{watch.seen_by_listing}"
    assert not tally.problems, f"seed={seed}: {tally.problems}"
    assert not operator.exits_of_its_own, f"seed={seed}: operator runs ended by themselves " \
                                          f"{operator.exits_of_its_own}; see {tmp_path / 'operator.log'}"


async def in_flight(api: client.ApiClient) -> int | None:
    """Machines not provisioned yet or being deleted, now (None when the API server does not answer)."""
    try:
        listed = await client.CustomObjectsApi(api).list_namespaced_custom_object(
            meta.GROUP, meta.VERSION, NAMESPACE, "libvirtmachines", _request_timeout=5)
    except (client.exceptions.ApiException, aiohttp.ClientError, OSError, TimeoutError):
        return None
    return sum(1 for item in listed["items"] if item["metadata"].get("deletionTimestamp") or
               not (item.get("status") or {}).get("initialization", {}).get("provisioned"))


async def run_stage(stage: Stage, tally: Tally, api: client.ApiClient, host: LibvirtHost,
                    plane: cp.LocalControlPlane, uids: dict[str, str], *also) -> None:
    """The stage's creates and deletes and its libvirtd and kube-apiserver deaths, at once (and `also`)."""
    start = time.monotonic()
    spec = ipxe_image.machine_spec(host.pool_name, host.network_name)
    objects = client.CustomObjectsApi(api)

    async def machine_life(name: str) -> None:
        await at(start, stage.create_at[name])
        await create_machine(api, name, spec)
        body = await retrying(lambda: objects.get_namespaced_custom_object(
            meta.GROUP, meta.VERSION, NAMESPACE, "libvirtmachines", name), name)
        uids[name] = body["metadata"]["uid"]
        if name in stage.delete_at:
            await at(start, stage.delete_at[name])
            await delete_machine(api, name)

    async def kill_libvirtd() -> None:
        await at(start, stage.libvirtd_at)
        flying = await in_flight(api)
        old, new = await asyncio.to_thread(host.kill_and_restart_libvirtd)
        tally.libvirtd_restarts += 1
        print(f"[chaos] libvirtd SIGKILLed (pid {old}) with {flying} machines in flight, restarted (pid {new})")

    async def kill_apiserver() -> None:
        await at(start, stage.apiserver_at)
        flying = await in_flight(api)
        old, new = await asyncio.to_thread(plane.kill_and_restart_apiserver)
        tally.apiserver_restarts += 1
        print(f"[chaos] kube-apiserver SIGKILLed (pid {old}) with {flying} machines in flight, restarted (pid {new})")

    await asyncio.gather(kill_libvirtd(), kill_apiserver(), *map(machine_life, stage.create_at), *also)


async def kill_operator_again_and_again(plan: Plan, tally: Tally, api: client.ApiClient,
                                        operator: OperatorProcess) -> None:
    for (working, life), gap in zip(plan.lives, plan.gaps, strict=True):
        await operator.start()
        if working:
            tally.kills_while_working += await operator.logged(READY_LINE, READY_TIMEOUT_S)
        await asyncio.sleep(life)
        await operator.kill()
        tally.kills += 1
        tally.kills_in_flight += bool(await in_flight(api))
        await asyncio.sleep(gap)
    print(f"[chaos] {tally.kills} SIGKILLs of the operator done")


def domain_states(host) -> dict[str, tuple[str, str | None]]:
    """Each domain on the host by name: libvirt's state and, for a paused one, why (for a failure's message)."""
    with host.connect() as conn:
        infos = [machines.domain_info(conn, d.UUIDString()) for d in conn.listAllDomains()]
    return {info.name: (info.state, info.pause_reason) for info in infos if info is not None}


async def converge(plan: Plan, api: client.ApiClient, uids: dict[str, str],
                   host) -> tuple[dict[str, dict], dict[str, str]]:
    """Every live machine provisioned, every deleted one gone (its finalizer released)."""
    objects = client.CustomObjectsApi(api)
    deleted = {name for stage in plan.stages for name in stage.delete_at}
    wanted_live = {name for stage in plan.stages for name in stage.create_at} - deleted
    deadline = time.monotonic() + CONVERGE_S
    while True:
        listed = await retrying(lambda: objects.list_namespaced_custom_object(
            meta.GROUP, meta.VERSION, NAMESPACE, "libvirtmachines"), "list")
        present = {item["metadata"]["name"]: item for item in listed["items"]}
        provisioned = {name for name, body in present.items()
                       if (body.get("status") or {}).get("initialization", {}).get("provisioned")}
        if set(present) == wanted_live and provisioned == wanted_live:
            return present, {name: uids[name] for name in deleted}
        if time.monotonic() > deadline:
            states = {name: ((body.get("status") or {}).get("state"), body["metadata"].get("deletionTimestamp"),
                             [c.get("reason") for c in (body.get("status") or {}).get("conditions", [])])
                      for name, body in present.items()}
            raise AssertionError(f"seed={plan.seed}: no convergence in {CONVERGE_S:.0f}s: want live "
                                 f"{sorted(wanted_live)}, see {states}; on the host: "
                                 f"{await asyncio.to_thread(domain_states, host)}")
        await asyncio.sleep(1.0)


async def wait_gone(api: client.ApiClient, names: set[str], seed: int) -> None:
    objects = client.CustomObjectsApi(api)
    deadline = time.monotonic() + 120
    while True:
        listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, NAMESPACE, "libvirtmachines")
        left = {item["metadata"]["name"] for item in listed["items"]} & names
        if not left:
            return
        assert time.monotonic() < deadline, f"seed={seed}: not deleted within 120s: {sorted(left)}"
        await asyncio.sleep(0.5)
