"""The domain record (`libvirt-domain-defined-on`, core.outage) is written with the placement, ahead of the define the
same pass sends, instead of in a write of its own before the define: one API write less per machine. A pass that ends
before it sent the define takes the record back, so a machine that never had a domain on a host that then fails may
still move; once the define was sent (even if its answer was lost) the record stays, so a machine never gets a second
domain elsewhere. Against the in-memory host and API."""

from __future__ import annotations

import pytest
from test_machine_phases_on_a_memory_host import HOST, NAME, NS, SPEC, bed, provisioned

from capi_libvirt.api import reasons
from capi_libvirt.core import outage
from capi_libvirt.hypervisor import errors
from capi_libvirt.reconcile import machine as machine_reconcile
from memory_api import LIBVIRT_MACHINES

pytestmark = pytest.mark.unit
RECORD = machine_reconcile.DOMAIN_RECORD_ANNOTATION


def record(b) -> str | None:
    return (b.body["metadata"].get("annotations") or {}).get(RECORD)


def metadata_writes(b) -> list[dict]:
    """The machine's writes other than its status."""
    return [patch for verb, name, patch in b.kube.writes
            if verb == f"PATCH {LIBVIRT_MACHINES}" and name == NAME and "status" not in patch]


async def test_placement_writes_the_record_and_a_smooth_provisioning_needs_no_other_metadata_write() -> None:
    b = await bed()
    await b.passes(provisioned)
    assert record(b) == HOST
    written = metadata_writes(b)
    assert len(written) == 1, written  # the placement: finalizer, identity, providerID and the record at once
    assert written[0]["metadata"]["annotations"][RECORD] == HOST
    b.kube.delete(LIBVIRT_MACHINES, NS, NAME)
    await machine_reconcile.reconcile(b.deps, NS, NAME)
    assert b.body is None and b.host.domains == {}


async def test_a_pass_that_ends_before_the_define_takes_the_record_back() -> None:
    b = await bed({**SPEC, "image": {"volume": "absent.qcow2"}})
    await machine_reconcile.reconcile(b.deps, NS, NAME)
    assert b.condition()["reason"] == reasons.IMAGE_NOT_FOUND
    assert record(b) == outage.NEVER_DEFINED, "no define was sent: the machine may still move"
    assert b.host.domains == {}


async def test_a_define_whose_answer_was_lost_keeps_the_record() -> None:
    b = await bed()
    b.host.fail("define_domain", errors.HostUnreachable("define domain: Cannot recv data", HOST))
    await machine_reconcile.reconcile(b.deps, NS, NAME)
    assert b.condition()["reason"] == reasons.HOST_UNREACHABLE
    assert record(b) == HOST, "the define was sent: a domain may exist there"
    await b.passes(provisioned)
    assert record(b) == HOST and len(b.host.domains) == 1


async def test_a_record_left_naming_the_host_with_no_domain_there_is_taken_back_by_a_later_pass() -> None:
    """The operator stopped between a placement and its define (or a take-back met a conflict): the record names the
    host, no domain is there. The next pass that ends before a define says so again, so neither an outage nor the
    address check (which counts a machine with a record as holding its addresses) treats a domain as there."""
    b = await bed({**SPEC, "image": {"volume": "absent.qcow2"}})
    await machine_reconcile.reconcile(b.deps, NS, NAME)
    b.kube.objects[(LIBVIRT_MACHINES, NS, NAME)]["metadata"]["annotations"][RECORD] = HOST  # left so
    await machine_reconcile.reconcile(b.deps, NS, NAME)
    assert b.condition()["reason"] == reasons.IMAGE_NOT_FOUND
    assert record(b) == outage.NEVER_DEFINED and b.host.domains == {}
