"""The machine reconcile around host outages, with a fake of the API and the in-memory host
(tests/one_placed_machine.py): a machine that never had a domain moves in one guarded write; one whose domain may
exist stays; deleting a machine of a decommissioned host never touches it and releases the finalizer with a
Warning."""

from __future__ import annotations

import types

import pytest

from capi_libvirt.api import reasons, v1alpha1
from capi_libvirt.core import capi_objects, naming, outage, placement, provider_id
from capi_libvirt.reconcile import machine as machine_reconcile
from capi_libvirt.reconcile.machine import DOMAIN_RECORD_ANNOTATION, FORMER_HOSTS_ANNOTATION
from one_placed_machine import PROVIDER_ID, SOURCE_UID, deps_for, domain_of, placed

pytestmark = pytest.mark.unit


def outage_deps(record: str | None, state: outage.HostState):
    extra = {} if record is None else {DOMAIN_RECORD_ANNOTATION: record}
    body = placed(extra_annotations=extra)
    deps, host, events = deps_for(body, None)
    deps.inventory.state = lambda name: state if name == "kvm1" else outage.HostState()
    deps.inventory.hosts = {"kvm1": types.SimpleNamespace(spec=types.SimpleNamespace(failure_domain=None,
                                                                                     decommissioned=False),
                                                          reachable=False)}
    deps.inventory.loads = lambda allocated, namespace=None, spec=None: [
        placement.HostLoad("kvm1", healthy=False, cpus=8, memory_mib=16384),
        placement.HostLoad("kvm2", healthy=True, cpus=8, memory_mib=16384, failure_domain="rack-b")]

    async def no_other_machines():
        return []
    deps.kube.list_libvirt_machines = no_other_machines
    deps.replace_after_s = 30.0
    machine = {"metadata": {"name": "m0"}, "spec": {"clusterName": "c1"}}
    p = machine_reconcile.MachinePass(body=body, spec=v1alpha1.LibvirtMachineSpec.model_validate(body["spec"]),
                                      status={}, machine=capi_objects.MachineView.of(machine))
    return deps, p, events


async def test_a_machine_that_never_had_a_domain_moves_in_one_guarded_write_naming_the_host_it_left():
    deps, p, events = outage_deps(outage.NEVER_DEFINED, outage.HostState(unreachable_for=31.0))
    await machine_reconcile.choose_host(deps, p)
    (patch,) = deps.kube.patches
    assert patch["spec"] == {"providerID": provider_id.format_provider_id("kvm2", naming.domain_uuid(SOURCE_UID))}
    assert patch["metadata"]["annotations"] == {FORMER_HOSTS_ANNOTATION: "kvm1", DOMAIN_RECORD_ANNOTATION: ""}
    assert patch["metadata"]["resourceVersion"] == "7"  # guarded
    assert p.host == "kvm2" and p.status["host"] == "kvm2" and p.status["failureDomain"] == "rack-b"
    assert events == [reasons.REPLACED]
    assert machine_reconcile.recorded_host(deps.kube.body) == "kvm2"  # the providerID wins over a stale status


async def test_before_the_timeout_it_waits_with_the_time_left():
    deps, p, events = outage_deps(outage.NEVER_DEFINED, outage.HostState(unreachable_for=10.0))
    with pytest.raises(machine_reconcile.Wait) as waited:
        await machine_reconcile.choose_host(deps, p)
    assert waited.value.reason == reasons.HOST_UNREACHABLE and waited.value.retry_after == 20.0
    assert deps.kube.patches == []


@pytest.mark.parametrize("record", ["kvm1", None], ids=["define-recorded", "placed-by-an-earlier-release"])
async def test_a_machine_whose_domain_may_exist_stays_on_its_host(record):
    deps, p, events = outage_deps(record, outage.HostState(unreachable_for=3600.0))
    await machine_reconcile.choose_host(deps, p)
    assert p.host == "kvm1" and deps.kube.body["spec"]["providerID"] == PROVIDER_ID
    assert not [patch for patch in deps.kube.patches if "spec" in patch]


async def test_a_provider_id_moved_under_a_defined_domain_is_refused():
    deps, p, events = outage_deps("kvm9", outage.HostState())
    with pytest.raises(machine_reconcile.Wait) as waited:
        await machine_reconcile.choose_host(deps, p)
    assert waited.value.reason == reasons.DOMAIN_HOST_MISMATCH and "kvm9" in waited.value.message


async def test_deleting_a_machine_of_a_decommissioned_host_releases_it_without_touching_the_host():
    deps, host, events = deps_for(placed(deleting=True, extra_annotations={DOMAIN_RECORD_ANNOTATION: "kvm1"}),
                                  domain_of())
    deps.inventory.state = lambda name: outage.HostState(decommissioned=True)
    assert await machine_reconcile.reconcile(deps, "ns", "m0") is None
    assert host.asked == []
    assert events == [reasons.HOST_DECOMMISSIONED]
    assert deps.kube.patches[-1]["metadata"]["finalizers"] is None


async def test_a_machine_is_only_replaced_onto_a_host_whose_access_rules_allow_it():
    """Re-placement goes through placement with the machine's namespace and spec: a host that refuses the tenant is
    no way out of an outage (the machine waits; refusing hosts are not named to the tenant, as in placement)."""
    deps, p, events = outage_deps(outage.NEVER_DEFINED, outage.HostState(unreachable_for=31.0))
    asked = []

    def loads(allocated, namespace=None, spec=None):
        asked.append((namespace, spec))
        return [placement.HostLoad("kvm1", healthy=False, cpus=8, memory_mib=16384),
                placement.HostLoad("kvm2", healthy=True, cpus=8, memory_mib=16384,
                                   refusal="host kvm2 does not allow namespace ns")]
    deps.inventory.loads = loads
    with pytest.raises(machine_reconcile.Wait) as waited:
        await machine_reconcile.choose_host(deps, p)
    assert waited.value.reason == reasons.HOST_UNREACHABLE
    assert "no other host: no healthy host" in waited.value.message and "kvm2" not in waited.value.message
    assert asked == [(p.namespace, p.spec)] and deps.kube.patches == [] and events == []
