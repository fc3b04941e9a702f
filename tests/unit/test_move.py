"""clusterctl move: a copied LibvirtMachine (new UID, no status, same spec, finalizers and annotations) keeps naming
the same domain, is adopted rather than placed again, and the deletion of the source copy never touches the host.

The reconcile runs against a fake of the API and the in-memory host (tests/one_placed_machine.py): what they record
is every write and every host operation."""

from __future__ import annotations

import types

import pytest

from capi_libvirt.api import reasons, v1alpha1
from capi_libvirt.core import capacity, naming, provider_id
from capi_libvirt.reconcile import hosts as hosts_reconcile
from capi_libvirt.reconcile import machine as machine_reconcile
from capi_libvirt.reconcile.machine import DELETE_FOR_MOVE_ANNOTATION, FINALIZER, IDENTITY_ANNOTATION
from capi_libvirt.reconcile.machine import DOMAIN_RECORD_ANNOTATION as DOMAIN_RECORD
from one_placed_machine import COPY_UID, PROVIDER_ID, SOURCE_UID, deps_for, domain_of, placed

NOW = "2026-12-04T00:00:00Z"
pytestmark = pytest.mark.unit

# -- identity -----------------------------------------------------------------------------------------------------

def test_identity_is_the_annotation_the_provider_id_vouches_for_else_the_uid() -> None:
    copy = placed(COPY_UID)
    assert naming.identity_uid(copy) == SOURCE_UID
    assert naming.identity_uid(placed(COPY_UID, annotation=None)) == COPY_UID
    never_placed = placed(COPY_UID)
    del never_placed["spec"]["providerID"]
    assert naming.identity_uid(never_placed) == COPY_UID, "a cloned manifest without providerID is a new machine"
    assert naming.identity_uid(placed(COPY_UID, annotation="33333333-3333-4333-8333-333333333333")) == COPY_UID
    assert naming.identity_uid({"metadata": {"uid": "u"}, "spec": {"providerID": "not one"}}) == "u"


def test_a_copy_records_the_same_host_and_names_as_its_source() -> None:
    source, copy = placed(SOURCE_UID, status={"host": "kvm1"}), placed(COPY_UID)
    assert machine_reconcile.recorded_host(copy) == machine_reconcile.recorded_host(source) == "kvm1"
    assert machine_reconcile.recorded_host(placed(COPY_UID, annotation=None)) is None  # today's failure, without it
    spec = v1alpha1.LibvirtMachineSpec.model_validate(copy["spec"])
    a = machine_reconcile.MachinePass(body=source, spec=spec, status={})
    b = machine_reconcile.MachinePass(body=copy, spec=spec, status={})
    assert (a.uid, a.domain_uuid, a.domain_name, a.volumes()) == (b.uid, b.domain_uuid, b.domain_name, b.volumes())


def test_the_placement_patch_writes_finalizer_provider_id_identity_and_the_domain_record_in_one_guarded_write() -> None:
    """The record names the host ahead of the define the same pass sends (a pass that ends before it takes it back:
    tests/unit/test_domain_record.py)."""
    body = {"metadata": {"namespace": "ns", "name": "m0", "uid": SOURCE_UID, "resourceVersion": "3",
                         "finalizers": ["other"]}, "spec": {}}
    patch = machine_reconcile.placement_patch(body, "kvm1")
    assert patch == {"metadata": {"finalizers": ["other", FINALIZER], "annotations": {IDENTITY_ANNOTATION: SOURCE_UID,
                                                                             DOMAIN_RECORD: "kvm1"},
                                  "resourceVersion": "3"},
                     "spec": {"providerID": PROVIDER_ID}}


def test_machines_placed_before_the_annotation_get_it_and_the_finalizer_on_their_next_pass() -> None:
    old = placed(SOURCE_UID, annotation=None)
    assert machine_reconcile.identity_migration_patch(old) == {
        "metadata": {"annotations": {IDENTITY_ANNOTATION: SOURCE_UID}, "resourceVersion": "7"}}
    old["metadata"]["finalizers"] = ["kopf.zalando.org/KopfFinalizerMarker"]
    old["status"] = {"host": "kvm1"}
    assert machine_reconcile.identity_migration_patch(old)["metadata"]["finalizers"] == [
        "kopf.zalando.org/KopfFinalizerMarker", FINALIZER]
    assert machine_reconcile.identity_migration_patch(placed(COPY_UID)) is None


# -- adoption -----------------------------------------------------------------------------------------------------

async def test_a_moved_copy_is_adopted_status_rebuilt_never_placed_or_defined_again() -> None:
    deps, host, events = deps_for(placed(COPY_UID), domain_of())
    deps.inventory.hosts["kvm1"] = types.SimpleNamespace(spec=types.SimpleNamespace(failure_domain="rack-a"))
    assert await machine_reconcile.reconcile(deps, "ns", "m0") == machine_reconcile.RECHECK_PROVISIONED
    status = deps.kube.status_patches[-1]
    assert status["host"] == "kvm1" and status["domainUUID"] == naming.domain_uuid(SOURCE_UID)
    assert status["failureDomain"] == "rack-a"
    assert status["ready"] is True and status["initialization"] == {"provisioned": True} and status["state"] == "running"
    assert deps.kube.patches == []  # providerID, finalizer and annotation already right: nothing to write
    # Its Machine has a nodeRef and the copy no status: the host is asked once whether an ISO is left (none).
    assert {name for name, _ in host.asked} == {"domain_info", "domain_addresses", "eject_nocloud", "delete_nocloud"}
    assert status["noCloudISORemoved"] is True


async def test_a_copy_moved_without_the_annotation_is_adopted_by_its_domains_owner_metadata() -> None:
    deps, host, events = deps_for(placed(COPY_UID, annotation=None), domain_of())
    assert await machine_reconcile.reconcile(deps, "ns", "m0") == machine_reconcile.RECHECK_PROVISIONED
    assert deps.kube.patches[0]["metadata"]["annotations"] == {IDENTITY_ANNOTATION: SOURCE_UID}
    assert "Adopted" in events
    assert deps.kube.status_patches[-1]["domainUUID"] == naming.domain_uuid(SOURCE_UID)


@pytest.mark.parametrize("domain", [None, domain_of(name="someone-else")])
async def test_a_provider_id_naming_no_domain_of_this_machine_is_refused_not_placed_again(domain) -> None:
    deps, host, events = deps_for(placed(COPY_UID, annotation=None), domain)
    await machine_reconcile.reconcile(deps, "ns", "m0")
    provisioned = [c for c in deps.kube.status_patches[-1]["conditions"] if c["type"] == "Provisioned"][0]
    assert provisioned["reason"] == reasons.ADOPTION_REFUSED
    assert deps.kube.patches == []


async def test_a_clone_under_another_name_does_not_take_over_the_domain() -> None:
    clone = placed(COPY_UID)
    clone["metadata"]["name"] = "m1"
    deps, host, events = deps_for(clone, domain_of())
    await machine_reconcile.reconcile(deps, "ns", "m1")
    provisioned = [c for c in deps.kube.status_patches[-1]["conditions"] if c["type"] == "Provisioned"][0]
    assert provisioned["reason"] == reasons.ADOPTION_REFUSED
    assert [name for name, _ in host.asked] == ["domain_info"]


# -- deletion -----------------------------------------------------------------------------------------------------

async def test_delete_for_move_releases_the_finalizer_without_a_host_call() -> None:
    body = placed(SOURCE_UID, status={"host": "kvm1"}, extra_annotations={DELETE_FOR_MOVE_ANNOTATION: ""},
                  deleting=True)
    deps, host, events = deps_for(body, domain_of())
    assert await machine_reconcile.reconcile(deps, "ns", "m0") is None
    assert host.asked == []
    assert deps.kube.patches == [{"metadata": {"finalizers": None, "resourceVersion": "7"}}]
    assert events == [reasons.DELETED_FOR_MOVE]


async def test_a_paused_cluster_keeps_the_finalizer_and_the_host_untouched() -> None:
    deps, host, events = deps_for(placed(SOURCE_UID, status={"host": "kvm1"}, deleting=True), domain_of())
    deps.kube.cluster["spec"]["paused"] = True
    assert await machine_reconcile.reconcile(deps, "ns", "m0") == machine_reconcile.RECHECK_WAITING
    assert host.asked == [] and deps.kube.patches == []


async def test_deleting_a_moved_copy_removes_the_domain_of_its_identity() -> None:
    deps, host, events = deps_for(placed(COPY_UID, deleting=True), domain_of())
    assert await machine_reconcile.reconcile(deps, "ns", "m0") is None
    assert host.asked == [("delete_machine", (naming.domain_uuid(SOURCE_UID), SOURCE_UID,
                                              machine_reconcile.machine_volumes("ns", "m0", SOURCE_UID, "default"),
                                              "ns", "m0"))]
    assert deps.kube.patches[-1]["metadata"]["finalizers"] is None


async def test_deleting_a_copy_without_annotation_or_status_looks_the_domain_up_instead_of_leaking_it() -> None:
    deps, host, events = deps_for(placed(COPY_UID, annotation=None, deleting=True), domain_of())
    assert await machine_reconcile.reconcile(deps, "ns", "m0") is None
    assert [name for name, _ in host.asked] == ["domain_info", "delete_machine"]
    assert host.asked[1][1][:2] == (naming.domain_uuid(SOURCE_UID), SOURCE_UID)


async def test_deleting_when_the_provider_id_names_no_domain_of_this_machine_leaves_the_host_alone() -> None:
    deps, host, events = deps_for(placed(COPY_UID, annotation=None, deleting=True), domain_of(name="other"))
    assert await machine_reconcile.reconcile(deps, "ns", "m0") is None
    assert [name for name, _ in host.asked] == ["domain_info"]


# -- copies of LibvirtHosts and LibvirtMachineTemplates on a running target ---------------------------------------

def test_a_template_copy_without_status_gets_capacity_and_node_info_and_a_current_one_nothing() -> None:
    spec = v1alpha1.LibvirtMachineTemplateSpec.model_validate(
        {"template": {"spec": {"image": {"volume": "base.qcow2"}, "cpus": 2, "memoryMiB": 4096}}})
    wanted = capacity.template_status_update(spec, None, 1, NOW)
    assert wanted == {"capacity": {"cpu": "2", "memory": "4096Mi", "ephemeral-storage": "20Gi"},
                      "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"}}
    assert capacity.template_status_update(spec, {**wanted, "other": 1}, 1, NOW) is None  # its own write ends the loop
    assert capacity.template_status_update(spec, {**wanted, "capacity": {"cpu": "1"}}, 1, NOW) == {
        "capacity": wanted["capacity"]}


def test_a_template_edited_in_place_says_so_once_per_generation() -> None:
    spec = v1alpha1.LibvirtMachineTemplateSpec.model_validate(
        {"template": {"spec": {"image": {"volume": "base.qcow2"}, "cpus": 8, "memoryMiB": 4096}}})
    current = {"capacity": {"cpu": "2", "memory": "4096Mi", "ephemeral-storage": "20Gi"},
               "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"}}
    changed = capacity.template_status_update(spec, current, 2, NOW)
    assert changed is not None and changed["capacity"]["cpu"] == "8"
    [edited] = changed["conditions"]
    assert (edited["type"], edited["status"], edited["reason"], edited["observedGeneration"]) == (
        "EditedInPlace", "True", "EditedInPlace", 2)
    assert "generation 2" in edited["message"] and "create a new LibvirtMachineTemplate" in edited["message"]
    assert capacity.template_status_update(spec, {**current, **changed}, 2, NOW) is None
    again = capacity.template_status_update(spec, {**current, **changed}, 3, "2026-12-05T00:00:00Z")
    assert again is not None and again["conditions"][0]["observedGeneration"] == 3
    assert again["conditions"][0]["lastTransitionTime"] == NOW  # still True: the time it first became so


async def test_hosts_missing_from_the_inventory_are_added_each_round_known_and_deleting_ones_are_not(
        monkeypatch) -> None:
    listed = [{"metadata": {"name": name}, "spec": {"uri": f"qemu+ssh://root@{name}/system"}}
              for name in ("copied", "known", "static", "refused")]
    listed.append({"metadata": {"name": "going", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {}})
    upserted = []

    async def upsert_host(deps, name, spec):
        upserted.append((name, spec["uri"]))
        if name == "refused":
            raise machine_reconcile.Wait("HostUnreachable", "credentials Secret x/y not found")

    async def list_libvirt_hosts():
        return listed

    monkeypatch.setattr(hosts_reconcile, "upsert_host", upsert_host)
    deps = types.SimpleNamespace(kube=types.SimpleNamespace(list_libvirt_hosts=list_libvirt_hosts),
                                 inventory=types.SimpleNamespace(hosts={"known": 1, "static": 1}, static={"static"}))
    assert await hosts_reconcile.add_missing_hosts(deps) == ["copied", "refused"]
    assert upserted == [("copied", "qemu+ssh://root@copied/system"), ("refused", "qemu+ssh://root@refused/system")]


async def test_a_host_entering_the_inventory_is_announced_once_an_update_is_not(monkeypatch) -> None:
    added, probed = [], []

    class Inventory:
        hosts: dict = {}

        def upsert(self, name, spec, secret):
            self.hosts[name] = types.SimpleNamespace(spec=spec)  # as the inventory keeps a host: with its spec
            return None

    async def probe_and_publish(deps, name):
        probed.append(name)

    monkeypatch.setattr(hosts_reconcile, "probe_and_publish", probe_and_publish)
    unplaced_woken = []
    deps = types.SimpleNamespace(inventory=Inventory(), wake_host=added.append,
                                 wake_unplaced=lambda: unplaced_woken.append(True))
    spec = {"uri": "qemu+ssh://root@kvm1/system", "storagePool": "default"}
    await hosts_reconcile.upsert_host(deps, "kvm1", spec)
    await hosts_reconcile.upsert_host(deps, "kvm1", spec)  # a spec update or a resume: already known
    assert added == ["kvm1"] and probed == ["kvm1", "kvm1"]
    assert unplaced_woken == [True]  # a new host may take a machine waiting for one; the same spec again adds nothing


async def test_machines_placed_on_an_added_host_are_queued_now_with_their_backoff_cleared() -> None:
    from capi_libvirt.operator import handlers

    bodies = [placed(), {**placed(), "metadata": {"name": "by-status", "namespace": "ns"}, "spec": {},
                         "status": {"host": "kvm1"}},
              {"metadata": {"name": "elsewhere", "namespace": "ns"},
               "spec": {"providerID": provider_id.format_provider_id("kvm2", naming.domain_uuid(SOURCE_UID))}},
              {"metadata": {"name": "unplaced", "namespace": "ns"}, "spec": {}}]
    cache = types.SimpleNamespace(items=lambda kind: bodies)
    deps = machine_reconcile.Dependencies(kube=types.SimpleNamespace(cache=cache), inventory=None,
                                          post_event=lambda *args: None)
    runtime = handlers.Runtime(deps)
    deps = runtime.deps  # the reconciles' dependencies, whose wake-ups are the runtime's
    assert deps.wake_host == runtime.wake_host and deps.wake_unplaced == runtime.wake_unplaced
    deps.failures.update({("ns", "m0"): 5, ("ns", "elsewhere"): 3})
    queued = []
    runtime.machines = types.SimpleNamespace(add=queued.append)
    deps.wake_host("kvm1")
    assert queued == [("ns", "m0"), ("ns", "by-status")]
    assert deps.failures == {("ns", "elsewhere"): 3}
