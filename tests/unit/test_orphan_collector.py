"""The orphan collector's round (reconcile.orphans.collect_host) against the in-memory host and a stand-in of the API: the grace
period, the last-word fresh LIST before anything is removed, the events and the status it writes; and the operator
options that configure it. (The real host and API server: tests/integration/test_orphans_on_a_host.py.)"""

from __future__ import annotations

import types
import uuid

import pytest

from capi_libvirt import cli
from capi_libvirt.core import domain_owner, naming, provider_id
from capi_libvirt.core import orphans as rules
from capi_libvirt.core.domain_owner import Owner
from capi_libvirt.core.orphans import HostDomain
from capi_libvirt.operator import config
from capi_libvirt.reconcile import machine as machine_reconcile
from capi_libvirt.reconcile import orphans as collector
from devenv.memory_host import MemoryHost
from devenv.memory_state import Domain

pytestmark = pytest.mark.unit

ME = str(uuid.uuid4())
HOST = "kvm1"
GRACE = 30.0


def ours(name: str) -> HostDomain:
    uid = str(uuid.uuid4())
    return HostDomain(uuid=naming.domain_uuid(uid), name=naming.domain_name("ns", name, uid),
                      owner=Owner("ns", name, uid, "c", ME),
                      paths=frozenset({f"/pool/{naming.overlay_volume_name('ns', name, uid)}", "/pool/base.qcow2"}))


def host_with(*domains: HostDomain) -> MemoryHost:
    """kvm1 in memory with these domains running, and the files they use as volumes of its pool (folder /pool)."""
    host = MemoryHost(HOST)
    host.pools["default"].path = "/pool"
    for domain in domains:
        assert domain.owner is not None
        disks = "".join(f"<disk type='file' device='disk'><source file='{path}'/><target dev='vd{chr(97 + i)}'/></disk>"
                        for i, path in enumerate(sorted(domain.paths)))
        xml = (f"<domain><name>{domain.name}</name><uuid>{domain.uuid}</uuid><metadata>"
               f"{domain_owner.owner_metadata_xml(domain.owner)}</metadata><devices>{disks}</devices></domain>")
        host.domains[domain.uuid] = Domain(domain.uuid, domain.name, xml, "running")
        for path in domain.paths:
            if path.rsplit("/", 1)[1] not in host.pools["default"].volumes:
                host.add_volume("default", path.rsplit("/", 1)[1])
    return host


def removed(host: MemoryHost) -> list[tuple[str, frozenset[str]]]:
    """(domain name, paths) of each orphan the collector asked the host to remove."""
    return [(args[0].name, args[1]) for name, args in host.asked if name == "remove_orphan"]


class FakeKube:
    def __init__(self, cached: list[dict], fresh: list[dict]) -> None:
        self.cached, self.fresh, self.primed = cached, fresh, True
        self.statuses: list[dict] = []

    async def list_libvirt_machines(self) -> list[dict]:
        return self.cached

    async def list_libvirt_machines_fresh(self, namespaces=()) -> list[dict]:
        return self.fresh

    def cached_clusters(self) -> list[dict]:
        return []

    async def patch_libvirt_host_status(self, name: str, status: dict) -> dict:
        self.statuses.append(status["orphans"])
        return {}

    async def get_libvirt_host(self, name: str) -> dict:
        return {"kind": "LibvirtHost", "metadata": {"name": name, "uid": "host-uid"}}


def machine_of(domain: HostDomain) -> dict:
    assert domain.owner is not None
    return {"metadata": {"namespace": "ns", "name": domain.owner.name, "uid": domain.owner.uid},
            "spec": {"providerID": provider_id.format_provider_id(HOST, domain.uuid)}}


def dependencies(host: MemoryHost, kube: FakeKube, management: str | None = ME,
                 decommissioned: bool = False) -> types.SimpleNamespace:
    events: list[tuple[str, str, str]] = []
    removed: list[tuple[str, int, int]] = []
    known = types.SimpleNamespace(reachable=True, spec=types.SimpleNamespace(storage_pool="default",
                                                                             decommissioned=decommissioned))
    return types.SimpleNamespace(
        management_cluster=management, orphan_grace_s=GRACE, moved_away=set(), kube=kube,
        hosts=types.SimpleNamespace(get=lambda name: host),
        inventory=types.SimpleNamespace(hosts={HOST: known}, orphans={}, static=set(), machine_claims={}),
        post_event=lambda body, kind, reason, message: events.append((kind, reason, message)),
        observe=types.SimpleNamespace(orphans_removed=lambda *args: removed.append(args)),
        events=events, removed=removed)


async def test_an_orphan_is_reported_then_removed_after_the_grace_period_unless_a_fresh_list_claims_it() -> None:
    orphan, late = ours("gone"), ours("late")  # `late`: a machine the watch cache has not delivered yet
    host, kube = host_with(orphan, late), FakeKube(cached=[], fresh=[machine_of(late)])
    deps = dependencies(host, kube)

    record = await collector.collect_host(deps, HOST, clock=lambda: 100.0)
    assert record is not None and record.pending == 2 and removed(host) == []
    assert [(kind, reason) for kind, reason, _ in deps.events] == [("Warning", "OrphanFound")]
    assert orphan.name in deps.events[0][2] and late.name in deps.events[0][2]
    assert kube.statuses[-1]["count"] == 2 and kube.statuses[-1]["removed"] == 0

    await collector.collect_host(deps, HOST, clock=lambda: 100.0 + GRACE - 1)
    assert removed(host) == [] and len(deps.events) == 1  # within the grace period; no second OrphanFound

    record = await collector.collect_host(deps, HOST, clock=lambda: 100.0 + GRACE)
    assert [name for name, _ in removed(host)] == [orphan.name]  # `late` is claimed by the fresh LIST
    assert removed(host)[0][1] == {p for p in orphan.paths if "base" not in p}  # not a shared base image
    assert deps.events[-1][:2] == ("Warning", "OrphanRemoved") and "ns/gone" in deps.events[-1][2]
    assert deps.removed == [(HOST, 1, 1)]
    assert (record.removed_domains, record.removed_volumes, record.pending) == (1, 1, 1)
    assert kube.statuses[-1]["removed"] == 1 and kube.statuses[-1]["domains"] == [late.name]


async def test_without_a_management_cluster_identity_nothing_is_looked_at() -> None:
    host = host_with(ours("gone"))
    deps = dependencies(host, FakeKube([], []), management=None)
    assert await collector.collect_host(deps, HOST, clock=lambda: 1e9) is None
    assert removed(host) == [] and deps.events == []


async def test_a_decommissioned_host_is_never_contacted() -> None:
    host = host_with(ours("gone"))
    deps = dependencies(host, FakeKube([], []), decommissioned=True)
    assert await collector.collect_host(deps, HOST, clock=lambda: 1e9) is None
    assert host.asked == [], "a decommissioned host was asked something"
    assert deps.events == [] and deps.kube.statuses == []


async def test_a_replaced_machines_domain_left_on_its_old_host_is_claimed_not_collected() -> None:
    """Outage re-placement changes only the providerID's host (same domain UUID, same identity): whatever the machine
    left on the host it moved away from stays its own, for its reconcile (clean_former_hosts) to remove."""
    left = ours("moved-off")
    moved = machine_of(left)
    moved["spec"]["providerID"] = provider_id.format_provider_id("kvm2", left.uuid)
    moved["metadata"]["annotations"] = {machine_reconcile.FORMER_HOSTS_ANNOTATION: HOST}
    host = host_with(left)
    deps = dependencies(host, FakeKube(cached=[moved], fresh=[moved]))
    record = await collector.collect_host(deps, HOST, clock=lambda: 1e9)
    assert record is not None and record.pending == 0 and removed(host) == [] and deps.events == []


async def test_a_machine_deleted_for_move_is_released_not_collected() -> None:
    moved = ours("moved")
    assert moved.owner is not None
    host = host_with(moved)
    deps = dependencies(host, FakeKube([], []))
    deps.moved_away.add(moved.owner.uid)
    record = await collector.collect_host(deps, HOST, clock=lambda: 1e9)
    released = [args for name, args in host.asked if name == "set_owner"]
    assert released == [(moved.uuid, Owner("ns", "moved", moved.owner.uid, "c", None), moved.owner)]
    assert removed(host) == [] and record is not None and record.kept == 1 and record.pending == 0


def test_grace_period_option() -> None:
    assert config.parse_grace_period("never") is None
    assert config.parse_grace_period("90") == 90.0
    with pytest.raises(ValueError):
        config.parse_grace_period("-1")
    args = cli.parser().parse_args(["run", "--orphan-grace-period", "never", "--management-cluster-id", "mc-1"])
    assert (args.orphan_grace_s, args.management_cluster_id) == (None, "mc-1")
    for bad in (["--orphan-grace-period", "soon"], ["--management-cluster-id", "<x/>"]):
        with pytest.raises(SystemExit):
            cli.parser().parse_args(["run", *bad])
    built = cli.run_config(args)
    assert (built.management_cluster_id, built.orphan_grace_s) == ("mc-1", None)
    assert config.from_arguments({}).orphan_grace_s == 3600.0  # an hour by default


def test_each_round_reads_only_the_machines_whose_body_changed_and_claims_what_a_full_count_claims(monkeypatch):
    read: list[str] = []
    full = rules.machine_claim
    monkeypatch.setattr(rules, "machine_claim", lambda body: read.append(body["metadata"]["name"]) or full(body))
    domains = [ours(f"m{i}") for i in range(5)]
    machines = [machine_of(domain) for domain in domains]
    deps = dependencies(MemoryHost(HOST), FakeKube(machines, machines))
    first = collector._cached_claims(deps, machines, ())
    assert sorted(read) == [f"m{i}" for i in range(5)] and first == rules.claims_of(machines, set())
    machines[2] = {**machines[2], "status": {"domainUUID": "changed"}}  # a new body
    second = collector._cached_claims(deps, machines[:4], ())  # and m4 deleted
    assert read[5:] == ["m2"] and second == rules.claims_of(machines[:4], set())
    assert set(deps.inventory.machine_claims) == {("ns", f"m{i}") for i in range(4)}, "a deleted machine is forgotten"
