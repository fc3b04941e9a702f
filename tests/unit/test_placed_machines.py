"""reconcile.placed: every machine's host and claim kept by difference. What it answers must be what counting every
body from scratch answers (core.placement.claims_by_host), after any sequence of machines placed, changed, moved and
deleted; and a body it has seen is not read again."""

from __future__ import annotations

import random
from typing import Any

import pytest

from capi_libvirt.core import placement
from capi_libvirt.reconcile.placed import PlacedMachines, Record

pytestmark = pytest.mark.unit


def body(name: str, host: str | None, cpus: int = 1, namespace: str = "ns", group: str = "md-0",
         version: int = 1) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "uid": f"uid-{namespace}-{name}",
                         "resourceVersion": str(version), "labels": {"group": group}},
            "spec": {"cpus": cpus, "memoryMiB": 512 * cpus, "diskGiB": 10, "storagePool": "default"},
            "status": {"host": host} if host else {}}


def record_of(machine: dict[str, Any]) -> Record | None:
    host = machine["status"].get("host")
    if host is None:
        return None
    metadata = machine["metadata"]
    return Record(host, metadata["uid"], (metadata["namespace"], "", metadata["labels"]["group"]),
                  placement.Claim.of(metadata["namespace"], machine["spec"]))


def from_scratch(bodies: list[dict[str, Any]], excluding_uid: str | None = None) -> dict[str, placement.HostClaims]:
    return placement.claims_by_host((b["status"]["host"], b["metadata"]["namespace"], b["spec"]) for b in bodies
                                    if b["status"].get("host") and b["metadata"]["uid"] != excluding_uid)


def comparable(claims) -> dict[str, tuple]:
    """Hosts with something claimed, as plain values (a host whose last machine left counts as none)."""
    return {host: (c.cpus, c.memory_mib, {p: b for p, b in c.pool_bytes.items() if b}, dict(c.by_namespace))
            for host, c in claims.items() if c.cpus or c.by_namespace}


def test_a_body_seen_is_not_read_again_and_a_new_one_is():
    placed = PlacedMachines()
    bodies = [body(f"m{i}", f"h{i % 3}") for i in range(30)]
    placed.refresh(bodies, record_of)
    assert placed.reads == 30
    placed.refresh(bodies, record_of)
    assert placed.reads == 30  # the very same objects: nothing read
    bodies[4] = body("m4", "h1", cpus=2, version=2)  # a change is a new body
    placed.refresh(bodies, record_of)
    assert placed.reads == 31
    assert comparable(placed.claims()) == comparable(from_scratch(bodies))


def test_gone_machines_are_counted_out_and_excluding_one_leaves_the_rest_alone():
    placed = PlacedMachines()
    bodies = [body("a", "h1", cpus=2), body("b", "h1"), body("c", "h2", namespace="other"), body("d", None)]
    placed.refresh(bodies, record_of)
    assert comparable(placed.claims(excluding_uid="uid-ns-a")) == comparable(from_scratch(bodies, "uid-ns-a"))
    assert placed.claims()["h1"].cpus == 3  # the exclusion was a copy
    assert [b["metadata"]["name"] for b in placed.on_host("h1")] == ["a", "b"]
    assert placed.group_per_host(("ns", "", "md-0")) == {"h1": 2}
    assert placed.group_per_host(("ns", "", "md-0"), excluding_uid="uid-ns-b") == {"h1": 1}
    placed.refresh(bodies[2:], record_of)
    assert comparable(placed.claims()) == comparable(from_scratch(bodies[2:]))
    assert placed.on_host("h1") == [] and placed.group_per_host(("ns", "", "md-0")) == {}
    assert "ns" not in placed.claims().get("h1", placement.HostClaims()).by_namespace


def test_any_sequence_of_changes_answers_what_counting_from_scratch_answers():
    rng = random.Random(28)
    placed, fleet = PlacedMachines(), {}
    for step in range(600):
        name = f"m{rng.randrange(60)}"
        action = rng.random()
        if action < 0.2 and name in fleet:
            del fleet[name]
        else:  # placed, moved, resized, or not placed (yet)
            host = rng.choice(["h1", "h2", "h3", None])
            fleet[name] = body(name, host, cpus=rng.randrange(1, 5), namespace=rng.choice(["ns", "team"]),
                               group=rng.choice(["md-0", "md-1"]), version=step)
        bodies = list(fleet.values())
        placed.refresh(bodies, record_of)
        assert comparable(placed.claims()) == comparable(from_scratch(bodies)), step
        victim = rng.choice(bodies)["metadata"]["uid"] if bodies else None
        assert comparable(placed.claims(excluding_uid=victim)) == comparable(from_scratch(bodies, victim)), step
        for group in [(ns, "", g) for ns in ("ns", "team") for g in ("md-0", "md-1")]:
            expected: dict[str, int] = {}
            for b in bodies:
                if b["status"].get("host") and (b["metadata"]["namespace"], "", b["metadata"]["labels"]["group"]) \
                        == group:
                    expected[b["status"]["host"]] = expected.get(b["status"]["host"], 0) + 1
            assert placed.group_per_host(group) == expected, step


def test_following_the_caches_change_log_answers_what_counting_from_scratch_answers(monkeypatch):
    """The operator's way: the records follow the watch-fed cache's change log (ObjectCache.changes) instead of
    reading every body, including when the log has forgotten old deletions and everything is read once again."""
    from capi_libvirt.kube import cache as cache_module

    monkeypatch.setattr(cache_module, "CHANGE_LOG_SLACK", 5)  # forget deletions early: the full read is taken too
    rng = random.Random(2028)
    cache, placed, full_reads = cache_module.ObjectCache(), PlacedMachines(), 0
    for step in range(1, 800):
        name = f"m{rng.randrange(40)}"
        held = cache.get("libvirtmachines", "ns", name)
        if rng.random() < 0.25 and held is not None:
            cache.delete("libvirtmachines", {**held, "metadata": {**held["metadata"], "resourceVersion": str(step)}})
        else:
            cache.put("libvirtmachines", body(name, rng.choice(["h1", "h2", None]), cpus=rng.randrange(1, 5),
                                              version=step))
        if rng.random() < 0.5 or 300 <= step < 450:
            continue  # several changes between two looks (and a long stretch without one)
        since, changes = cache.changes("libvirtmachines", placed.since)
        if changes is None:
            full_reads += 1
            placed.refresh(list(cache.items("libvirtmachines")), record_of)
        else:
            placed.apply(changes, record_of)
        placed.since = since
        bodies = list(cache.items("libvirtmachines"))
        assert comparable(placed.claims()) == comparable(from_scratch(bodies)), step
        assert sorted(b["metadata"]["name"] for h in ("h1", "h2") for b in placed.on_host(h)) == \
            sorted(b["metadata"]["name"] for b in bodies if b["status"].get("host")), step
    assert full_reads > 0  # the forgetting happened and was survived
