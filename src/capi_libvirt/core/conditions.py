"""metav1.Condition bookkeeping on plain API dicts (camelCase keys, as they sit in `status.conditions`).

Every function returns a new list and leaves its input alone. `lastTransitionTime` only moves when a condition's
status changes, so a reconcile that recomputes the same state does not make the condition look like it flapped. The
list is kept sorted (Ready first, then by type) so that writing the same state twice gives the same status patch.

Messages go into the object's status, which anyone allowed to read the object can see: callers must pass safe text,
never bootstrap data, keys, tokens or a libvirt URI with credentials in it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any, Literal

from capi_libvirt.api import reasons

Status = Literal["True", "False", "Unknown"]
STATUSES: tuple[Status, ...] = ("True", "False", "Unknown")
MESSAGE_MAX = 32768  # metav1.Condition's limit on message; longer text would get the whole status patch refused
_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")

# Condition types (api.reasons has each with its meaning, and every reason).
READY = reasons.READY
PROVISIONED = reasons.PROVISIONED  # its reason says which step the machine is at or waits for
PAUSED = reasons.PAUSED
DELETING = reasons.DELETING
ADDRESSES_DISCOVERED = reasons.ADDRESSES_DISCOVERED  # informational: Ready ignores it


def get_condition(conditions: Sequence[dict[str, Any]] | None, type: str) -> dict[str, Any] | None:
    """The condition of this type, or None."""
    return next((condition for condition in conditions or () if condition.get("type") == type), None)


def is_true(conditions: Sequence[dict[str, Any]] | None, type: str) -> bool:
    """Whether the condition of this type exists and is True."""
    condition = get_condition(conditions, type)
    return condition is not None and condition.get("status") == "True"


def set_condition(
    conditions: Sequence[dict[str, Any]] | None,
    type: str,
    status: Status,
    reason: str,
    message: str = "",
    *,
    now: str,
    observed_generation: int | None,
) -> list[dict[str, Any]]:
    """A new list with the condition of `type` set; its lastTransitionTime is `now` only if the status changed.

    `now` is an RFC 3339 timestamp ("2024-05-01T12:00:00Z"); `message` must be safe to show (see the module doc) and is
    cut to metav1's limit.
    """
    if status not in STATUSES:
        raise ValueError(f"condition status must be one of {STATUSES}, not {status!r}")
    if not _REASON.fullmatch(reason):
        raise ValueError(f"condition reason {reason!r} is not CamelCase ([A-Za-z][A-Za-z0-9_,:]*)")
    previous = get_condition(conditions, type)
    unchanged = previous is not None and previous.get("status") == status and previous.get("lastTransitionTime")
    condition: dict[str, Any] = {
        "type": type,
        "status": status,
        "lastTransitionTime": previous["lastTransitionTime"] if previous is not None and unchanged else now,
        "reason": reason,
        "message": message[:MESSAGE_MAX],
    }
    if observed_generation is not None:
        condition["observedGeneration"] = observed_generation
    others = [dict(other) for other in conditions or () if other.get("type") != type]
    return sort_conditions([*others, condition])


def remove_condition(conditions: Sequence[dict[str, Any]] | None, type: str) -> list[dict[str, Any]]:
    """A new list without the condition of this type."""
    return sort_conditions([dict(other) for other in conditions or () if other.get("type") != type])


def sort_conditions(conditions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ready first, then by type: a stable order, so the same state always serialises the same."""
    return sorted(conditions, key=lambda condition: (condition.get("type") != READY, str(condition.get("type"))))


def summarize_ready(
    conditions: Sequence[dict[str, Any]] | None,
    now: str,
    observed_generation: int | None,
    *,
    order: Sequence[str] = (),
    ignore: Collection[str] = (PAUSED,),
    negative_polarity: Collection[str] = (DELETING,),
    true_reason: str = reasons.PROVISIONED_REASON,
) -> list[dict[str, Any]]:
    """A new list with Ready computed from the other conditions.

    Ready is False with the reason and message of the first failing condition, else Unknown with those of the first
    unknown one, else True with `true_reason`. "First" follows `order` (condition types, most important first), then
    the type name. A condition fails when it is False, or True for `negative_polarity` types (Deleting: being deleted
    is not ready). `ignore`d types (Paused, which Cluster API reports on its own) do not count. With nothing to
    summarise, Ready is Unknown (NoConditions).
    """
    rank = {type: position for position, type in enumerate(order)}
    considered = sorted(
        (c for c in conditions or () if c.get("type") != READY and c.get("type") not in ignore),
        key=lambda c: (rank.get(str(c.get("type")), len(rank)), str(c.get("type"))),
    )

    def healthy(condition: dict[str, Any]) -> bool:
        expected = "False" if condition.get("type") in negative_polarity else "True"
        return condition.get("status") == expected

    status: Status
    failing = next((c for c in considered if c.get("status") != "Unknown" and not healthy(c)), None)
    unknown = next((c for c in considered if c.get("status") == "Unknown"), None)
    if failing is not None:
        status, reason, message = "False", failing["reason"], failing.get("message", "")
    elif unknown is not None:
        status, reason, message = "Unknown", unknown["reason"], unknown.get("message", "")
    elif considered:
        status, reason, message = "True", true_reason, ""
    else:
        status, reason, message = "Unknown", reasons.NO_CONDITIONS, ""
    return set_condition(
        conditions, READY, status, reason, message, now=now, observed_generation=observed_generation
    )
