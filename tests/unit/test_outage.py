"""What a placed machine does about an unreachable or decommissioned host (core.outage): go on, wait, or move, and
never move while a domain of it may exist on the host."""

from __future__ import annotations

import pytest

from capi_libvirt.api import reasons
from capi_libvirt.core import outage
from capi_libvirt.core.outage import Hold, HostState, Proceed, Replace, decide

pytestmark = pytest.mark.unit

NEVER = outage.NEVER_DEFINED
AFTER = 60.0


def test_a_reachable_or_never_probed_host_changes_nothing():
    for record in (NEVER, "kvm1", None):
        assert decide("kvm1", record, HostState(), AFTER, pinned=False) == Proceed()


def test_a_machine_that_never_had_a_domain_waits_for_the_timeout_then_moves():
    held = decide("kvm1", NEVER, HostState(unreachable_for=20.0), AFTER, pinned=False)
    assert isinstance(held, Hold) and held.reason == reasons.HOST_UNREACHABLE
    assert held.retry_after == 40.0 and "kvm1" in held.message and "40s" in held.message
    moved = decide("kvm1", NEVER, HostState(unreachable_for=60.0), AFTER, pinned=False)
    assert isinstance(moved, Replace) and "kvm1" in moved.message


@pytest.mark.parametrize("record", ["kvm1", None], ids=["define-recorded", "no-record-from-an-earlier-release"])
def test_a_machine_whose_domain_may_exist_never_moves_however_long_the_outage(record):
    """The one rule: never two domains. A define may have reached the host (recorded), or nobody knows (no record)."""
    assert decide("kvm1", record, HostState(unreachable_for=10_000.0), AFTER, pinned=False) == Proceed()
    held = decide("kvm1", record, HostState(decommissioned=True), AFTER, pinned=False)
    assert isinstance(held, Hold) and held.reason == reasons.HOST_DECOMMISSIONED
    assert "delete the machine" in held.message


def test_a_pinned_machine_stays_on_its_host():
    assert decide("kvm1", NEVER, HostState(unreachable_for=10_000.0), AFTER, pinned=True) == Proceed()
    held = decide("kvm1", NEVER, HostState(decommissioned=True), AFTER, pinned=True)
    assert isinstance(held, Hold) and held.reason == reasons.HOST_DECOMMISSIONED and "pinned" in held.message


def test_a_decommissioned_host_lets_a_machine_without_domain_move_at_once():
    moved = decide("kvm1", NEVER, HostState(decommissioned=True, unreachable_for=None), AFTER, pinned=False)
    assert isinstance(moved, Replace) and "decommissioned" in moved.message


def test_may_have_domain_is_false_only_for_the_explicit_never_defined_record():
    assert not outage.may_have_domain(NEVER)
    assert outage.may_have_domain("kvm1") and outage.may_have_domain(None)


def test_the_release_warning_names_the_domain_and_every_volume():
    message = outage.what_may_remain("kvm1", "ns-m0-abc", ["ns-m0-abc.qcow2", "ns-m0-abc-cidata.iso"])
    assert message.startswith("host kvm1 is decommissioned")
    assert "domain ns-m0-abc" in message and "volume ns-m0-abc.qcow2" in message and "cidata.iso" in message
    assert "domain" not in outage.what_may_remain("kvm1", None, ["v.qcow2"]).split("remain there: ")[1]
