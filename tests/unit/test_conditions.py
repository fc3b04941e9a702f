"""Condition bookkeeping: transition times only move on status changes, and Ready summarises the rest."""

from __future__ import annotations

import copy

import pytest

from capi_libvirt.api import meta, reasons
from capi_libvirt.core.conditions import (
    DELETING,
    PAUSED,
    PROVISIONED,
    READY,
    Status,
    get_condition,
    is_true,
    remove_condition,
    set_condition,
    summarize_ready,
)

pytestmark = pytest.mark.unit

T0 = "2024-05-01T12:00:00Z"
T1 = "2024-05-01T12:05:00Z"


def provisioned(
    status: Status, reason: str, message: str = "", now: str = T0, conditions: list[dict] | None = None
) -> list[dict]:
    """The conditions with Provisioned set, at generation 1."""
    return set_condition(conditions or [], PROVISIONED, status, reason, message, now=now, observed_generation=1)


def with_condition(conditions: list[dict], type: str, status: Status, reason: str) -> list[dict]:
    return set_condition(conditions, type, status, reason, now=T0, observed_generation=1)


def ready(conditions: list[dict], **options: object) -> dict:
    """The Ready condition summarize_ready computes at T0."""
    found = get_condition(summarize_ready(conditions, T0, 1, **options), READY)  # type: ignore[arg-type]
    assert found is not None
    return found


# --- set_condition -------------------------------------------------------------------------------------------------


def test_new_condition_gets_now_as_transition_time_and_all_fields() -> None:
    conditions = provisioned("False", reasons.IMAGE_IMPORTING, "creating the root disk")
    assert conditions == [
        {
            "type": PROVISIONED,
            "status": "False",
            "lastTransitionTime": T0,
            "reason": reasons.IMAGE_IMPORTING,
            "message": "creating the root disk",
            "observedGeneration": 1,
        }
    ]


def test_transition_time_is_kept_when_status_is_unchanged_even_if_reason_changes() -> None:
    before = provisioned("False", reasons.IMAGE_IMPORTING)
    after = provisioned("False", reasons.WAITING_FOR_BOOTSTRAP_DATA, "defining", now=T1, conditions=before)
    condition = get_condition(after, PROVISIONED)
    assert condition is not None
    assert condition["lastTransitionTime"] == T0
    assert (condition["reason"], condition["message"]) == (reasons.WAITING_FOR_BOOTSTRAP_DATA, "defining")


def test_transition_time_moves_when_status_changes() -> None:
    before = provisioned("False", reasons.WAITING_FOR_ADDRESS)
    after = provisioned("True", reasons.PROVISIONED_REASON, now=T1, conditions=before)
    assert after[0]["lastTransitionTime"] == T1


def test_observed_generation_is_updated_and_left_out_when_none() -> None:
    before = provisioned("True", reasons.PROVISIONED_REASON)
    after = set_condition(before, PROVISIONED, "True", reasons.PROVISIONED_REASON, now=T1, observed_generation=2)
    assert after[0]["observedGeneration"] == 2
    without = set_condition([], PAUSED, "False", reasons.PAUSED_REASON, now=T0, observed_generation=None)
    assert "observedGeneration" not in without[0]


def test_input_list_and_its_dicts_are_left_untouched() -> None:
    before = provisioned("False", reasons.IMAGE_IMPORTING)
    snapshot = copy.deepcopy(before)
    after = provisioned("True", reasons.PROVISIONED_REASON, now=T1, conditions=before)
    assert before == snapshot
    assert after is not before


def test_conditions_are_sorted_ready_first_then_by_type() -> None:
    conditions: list[dict] = []
    for type in ("Zeta", PROVISIONED, READY, "Alpha"):
        conditions = set_condition(conditions, type, "True", "Ok", now=T0, observed_generation=1)
    assert [c["type"] for c in conditions] == [READY, "Alpha", PROVISIONED, "Zeta"]


def test_setting_the_same_state_twice_gives_the_same_list() -> None:
    once = provisioned("False", reasons.WAITING_FOR_ADDRESS)
    twice = provisioned("False", reasons.WAITING_FOR_ADDRESS, now=T1, conditions=once)
    assert once == twice


def test_result_validates_as_metav1_conditions() -> None:
    for condition in summarize_ready(provisioned("False", reasons.HOST_UNREACHABLE, "no route"), T0, 1):
        meta.Condition.model_validate(condition)


def test_long_messages_are_cut_to_the_metav1_limit() -> None:
    condition = provisioned("False", reasons.DELETION_FAILED, "x" * 40000)[0]
    assert len(condition["message"]) == 32768


@pytest.mark.parametrize(("status", "reason"), [("Yes", "Ok"), ("True", "not camel"), ("True", ""), ("True", "1Bad")])
def test_invalid_status_or_reason_is_refused(status: str, reason: str) -> None:
    with pytest.raises(ValueError):
        set_condition([], PROVISIONED, status, reason, now=T0, observed_generation=1)  # type: ignore[arg-type]


def test_every_catalogued_reason_and_type_is_valid_for_metav1_condition() -> None:
    assert len(reasons.REASONS) > 60
    for reason in reasons.REASONS:
        set_condition([], PROVISIONED, "False", reason.name, now=T0, observed_generation=1)
    for condition_type in reasons.CONDITION_TYPES:
        set_condition([], condition_type.name, "False", reasons.INVALID_SPEC, now=T0, observed_generation=1)


def test_remove_and_query_helpers() -> None:
    conditions = provisioned("True", reasons.PROVISIONED_REASON)
    assert is_true(conditions, PROVISIONED)
    assert not is_true(conditions, READY)
    assert remove_condition(conditions, PROVISIONED) == []


# --- summarize_ready -----------------------------------------------------------------------------------------------


def test_ready_is_true_when_every_condition_is_true() -> None:
    summary = ready(provisioned("True", reasons.PROVISIONED_REASON))
    assert (summary["status"], summary["reason"]) == ("True", reasons.PROVISIONED_REASON)


def test_ready_is_false_with_the_failing_conditions_reason_and_message() -> None:
    summary = ready(provisioned("False", reasons.IMAGE_NOT_FOUND, "volume ubuntu.qcow2 not in pool default"))
    assert (summary["status"], summary["reason"], summary["message"]) == (
        "False",
        reasons.IMAGE_NOT_FOUND,
        "volume ubuntu.qcow2 not in pool default",
    )


def test_first_failing_condition_follows_the_given_order_then_the_type_name() -> None:
    conditions = provisioned("False", reasons.IMAGE_IMPORTING)
    conditions = with_condition(conditions, "HostReachable", "False", reasons.HOST_UNREACHABLE)
    assert ready(conditions)["reason"] == reasons.HOST_UNREACHABLE
    assert ready(conditions, order=[PROVISIONED])["reason"] == reasons.IMAGE_IMPORTING


def test_false_wins_over_unknown_and_unknown_over_true() -> None:
    conditions = provisioned("True", reasons.PROVISIONED_REASON)
    conditions = with_condition(conditions, "AgentConnected", "Unknown", "AgentNotAnswering")
    assert (ready(conditions)["status"], ready(conditions)["reason"]) == ("Unknown", "AgentNotAnswering")
    conditions = with_condition(conditions, "HostReachable", "False", reasons.HOST_UNREACHABLE)
    assert (ready(conditions)["status"], ready(conditions)["reason"]) == ("False", reasons.HOST_UNREACHABLE)


def test_paused_is_ignored_and_deleting_true_makes_ready_false() -> None:
    conditions = provisioned("True", reasons.PROVISIONED_REASON)
    conditions = with_condition(conditions, PAUSED, "True", reasons.PAUSED_REASON)
    conditions = with_condition(conditions, DELETING, "False", "NotDeleting")
    assert ready(conditions)["status"] == "True"
    conditions = with_condition(conditions, DELETING, "True", reasons.DELETION_FAILED)
    assert (ready(conditions)["status"], ready(conditions)["reason"]) == ("False", reasons.DELETION_FAILED)


def test_ready_keeps_its_transition_time_while_its_status_holds() -> None:
    first = summarize_ready(provisioned("False", reasons.IMAGE_IMPORTING), T0, 1)
    second = summarize_ready(provisioned("False", reasons.WAITING_FOR_ADDRESS, now=T1, conditions=first), T1, 1)
    summary = get_condition(second, READY)
    assert summary is not None
    assert (summary["lastTransitionTime"], summary["reason"]) == (T0, reasons.WAITING_FOR_ADDRESS)


def test_ready_summary_does_not_count_an_old_ready_condition() -> None:
    stale = with_condition(provisioned("True", reasons.PROVISIONED_REASON), READY, "False", reasons.IMAGE_IMPORTING)
    assert ready(stale)["status"] == "True"


def test_ready_is_unknown_with_nothing_to_summarise() -> None:
    summary = get_condition(summarize_ready([], T0, None), READY)
    assert summary is not None and (summary["status"], summary["reason"]) == ("Unknown", reasons.NO_CONDITIONS)
