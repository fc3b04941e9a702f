"""The operator's watch-fed cache: newer bodies win, late ones of deleted objects are ignored, a LIST replaces."""

from __future__ import annotations

import pytest

from capi_libvirt.kube.cache import ObjectCache

pytestmark = pytest.mark.unit


def body(name: str, version: int, uid: str = "u1", namespace: str = "ns") -> dict:
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": str(version)}}


def test_a_newer_body_replaces_and_says_so_an_older_or_equal_one_does_not() -> None:
    cache = ObjectCache()
    assert cache.put("machines", body("a", 5))
    assert not cache.put("machines", body("a", 5)), "the echo of our own write is no change"
    assert not cache.put("machines", body("a", 4)), "an event that raced a write's response"
    assert cache.put("machines", body("a", 6))
    assert cache.get("machines", "ns", "a")["metadata"]["resourceVersion"] == "6"
    assert cache.get("machines", "other", "a") is None and cache.get("clusters", "ns", "a") is None


def test_a_deleted_object_stays_deleted_until_a_newer_object_of_its_name_comes() -> None:
    cache = ObjectCache()
    cache.put("machines", body("a", 5))
    cache.delete("machines", body("a", 7))
    assert cache.get("machines", "ns", "a") is None
    assert not cache.put("machines", body("a", 6)), "a late body of the deleted object"
    assert cache.get("machines", "ns", "a") is None
    assert cache.put("machines", body("a", 9, uid="u2")), "a new object with the same name"
    assert cache.get("machines", "ns", "a")["metadata"]["uid"] == "u2"


def test_deleting_another_object_of_the_name_leaves_the_held_one() -> None:
    cache = ObjectCache()
    cache.put("machines", body("a", 9, uid="new"))
    cache.delete("machines", body("a", 8, uid="old"))
    assert cache.get("machines", "ns", "a")["metadata"]["uid"] == "new"


def test_a_list_replaces_what_it_no_longer_has_but_keeps_what_is_newer_than_it() -> None:
    cache = ObjectCache()
    cache.put("machines", body("gone", 3))
    cache.put("machines", body("newer", 12))
    cache.put("clusters", body("c", 1))
    cache.replace_all("machines", [body("kept", 8)], "10")
    assert sorted(b["metadata"]["name"] for b in cache.items("machines")) == ["kept", "newer"]
    assert cache.get("clusters", "ns", "c") is not None, "other kinds are not touched"


def test_cluster_scoped_objects_have_no_namespace() -> None:
    cache = ObjectCache()
    cache.put("libvirthosts", {"metadata": {"name": "h", "uid": "x", "resourceVersion": "1"}})
    assert cache.get("libvirthosts", "", "h") is not None


def test_watch_events_say_whether_they_changed_anything() -> None:
    cache = ObjectCache()
    assert cache.apply("machines", None, body("a", 3)), "a listed object"
    assert not cache.apply("machines", "MODIFIED", body("a", 3))
    assert cache.apply("machines", "MODIFIED", body("a", 4))
    assert cache.apply("machines", "DELETED", body("a", 5))
    assert cache.get("machines", "ns", "a") is None
    assert cache.events == {("machines", "changed"): 3, ("machines", "unchanged"): 1}, "counted for the metric"
    cache.put("machines", body("b", 1))
    cache.replace_all("machines", [], "9")
    assert sum(cache.events.values()) == 4, "a write's response and a LIST are no watch events"


def test_a_list_says_which_held_objects_it_dropped_and_their_late_events_stay_ignored() -> None:
    """What the operator's relist after a lost watch relies on: the dropped keys, and no resurrection by a late event
    of the old object."""
    cache = ObjectCache()
    cache.put("libvirtmachines", body("phantom", 5))
    cache.put("libvirtmachines", body("kept", 6))
    cache.put("libvirtmachines", body("newer", 12))
    assert cache.replace_all("libvirtmachines", [body("kept", 6)], "10") == [("libvirtmachines", "ns", "phantom")]
    assert cache.get("libvirtmachines", "ns", "phantom") is None
    assert cache.get("libvirtmachines", "ns", "newer") is not None, "written after the list: kept"
    assert not cache.apply("libvirtmachines", "MODIFIED", body("phantom", 5))
    assert cache.get("libvirtmachines", "ns", "phantom") is None


def test_bodies_are_held_without_their_managed_fields_and_the_given_body_is_left_as_it_was() -> None:
    cache = ObjectCache()
    given = body("a", 5)
    given["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:cpus": {}}}}]
    given["spec"] = {"cpus": 2}
    assert cache.put("machines", given)
    held = cache.get("machines", "ns", "a")
    assert "managedFields" not in held["metadata"] and held["spec"] == {"cpus": 2}
    assert held["metadata"]["resourceVersion"] == "5" and "managedFields" in given["metadata"]
