"""The shipped ClusterRole (config/rbac/role.yaml) and leader election Role (leader_election_role.yaml) hold nothing
the provider does not use: for every verb of every rule, a user bound to the role without that verb is refused (403)
the request the provider makes with it (the code that makes it is named beside each), which a user bound to the whole
role is allowed. And the ClusterRole reaches nothing beyond: no Secrets, and no verb on the provider's own kinds it
never uses (create, update, delete).

Requests run as those users through the admin's impersonation, against the real API server, on objects that exist.
"""

from __future__ import annotations

import contextlib
import copy
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import yaml

from capi_libvirt.api import meta
from devenv import control_plane as cp
from devenv.control_plane import ControlPlaneError

from fixtures_control_plane import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROLE = yaml.safe_load((REPO / "config" / "rbac" / "role.yaml").read_text())
LEADER_ROLE = yaml.safe_load((REPO / "config" / "rbac" / "leader_election_role.yaml").read_text())
PROPAGATION_S = 15.0  # RBAC changes reach the authorizer through its informers: moments, not seconds

# Who makes each request (apiGroup, or the core resource; "/status" for a status subresource; the verb).
NEEDED_BY = {
    ("infrastructure.cluster.x-k8s.io", "get"): "kube/api.py: re-reads of a LibvirtMachine, host, template, cluster",
    ("infrastructure.cluster.x-k8s.io", "list"): "kopf's watch, and kube/cache.py's list before it",
    ("infrastructure.cluster.x-k8s.io", "watch"): "kopf's watch of each kind (operator/handlers.py)",
    ("infrastructure.cluster.x-k8s.io", "patch"): "the finalizer, providerID and annotations (reconcile/)",
    ("infrastructure.cluster.x-k8s.io/status", "patch"): "every status write (reconcile/)",
    ("cluster.x-k8s.io", "get"): "reconcile/machine/owners.py find_owner_machine, find_cluster",
    ("cluster.x-k8s.io", "list"): "kopf's watch of Machines and Clusters (operator/handlers.py)",
    ("cluster.x-k8s.io", "watch"): "kopf's watch of Machines and Clusters (operator/handlers.py)",
    ("ipam.cluster.x-k8s.io", "get"): "reconcile/machine/checks.py resolve_addressing (claims and addresses)",
    ("ipam.cluster.x-k8s.io", "list"): "kopf's watch of IPAddressClaims (operator/handlers.py)",
    ("ipam.cluster.x-k8s.io", "watch"): "kopf's watch of IPAddressClaims (operator/handlers.py)",
    ("ipam.cluster.x-k8s.io", "create"): "reconcile/machine/checks.py resolve_addressing",
    ("ipam.cluster.x-k8s.io", "delete"): "reconcile/machine/teardown.py _release_ip_address_claims",
    ("events", "create"): "the reconciles' events (operator/handlers.py EventPoster) and kopf's",
    ("apiextensions.k8s.io", "get"): "kopf's discovery of the CRDs it watches",
    ("apiextensions.k8s.io", "list"): "kopf's discovery of the CRDs it watches",
    ("apiextensions.k8s.io", "watch"): "kopf's discovery of CRDs installed after it started",
    ("namespaces", "list"): "kopf with --namespace (operator/main.py)",
    ("namespaces", "watch"): "kopf with --namespace (operator/main.py)",
    ("namespaces", "get"): "the management cluster's identity (operator/handlers.py: kube-system's UID)",
}


def needed_by(group: str, resource: str, verb: str) -> str:
    key = group or resource.split("/")[0]
    return NEEDED_BY[(key + ("/status" if resource.endswith("/status") else ""), verb)]


@pytest.fixture(scope="module")
def bed(control_plane: cp.LocalControlPlane) -> Iterator[dict]:
    """One object of every kind the role names, in a namespace of this module's own."""
    plane = control_plane
    namespace = f"rbac-{uuid.uuid4().hex[:6]}"
    plane.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": namespace}})
    name = "probe"
    made = {
        f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{namespace}/libvirtclusters":
            {"kind": "LibvirtCluster", "spec": {}},
        f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{namespace}/libvirtmachines":
            {"kind": "LibvirtMachine", "spec": {"image": {"volume": "base.qcow2"}}},
        f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{namespace}/libvirtmachinetemplates":
            {"kind": "LibvirtMachineTemplate", "spec": {"template": {"spec": {"image": {"volume": "base.qcow2"}}}}},
        f"/apis/{meta.GROUP}/{meta.VERSION}/libvirthosts": {"kind": "LibvirtHost", "spec": {"uri": "qemu:///system"}},
        f"/apis/cluster.x-k8s.io/v1beta2/namespaces/{namespace}/clusters": {"kind": "Cluster", "spec": {"paused": True}},
        f"/apis/cluster.x-k8s.io/v1beta2/namespaces/{namespace}/machines": {"kind": "Machine", "spec": {
            "clusterName": name, "bootstrap": {"dataSecretName": "x"},
            "infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtMachine", "name": name}}},
        f"/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/{namespace}/ipaddressclaims": {"kind": "IPAddressClaim",
            "spec": {"poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"}}},
        f"/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/{namespace}/ipaddresses": {"kind": "IPAddress", "spec": {
            "address": "192.0.2.10", "prefix": 24, "claimRef": {"name": name},
            "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"}}},
    }
    for collection, body in made.items():
        group_version = collection.split("/")[2] + "/" + collection.split("/")[3]
        plane.request("POST", collection, {"apiVersion": group_version, "metadata": {"name": name}, **body})
    yield {"namespace": namespace, "name": name, "collections": list(made)}
    plane.request("DELETE", f"/apis/{meta.GROUP}/{meta.VERSION}/libvirthosts/{name}")
    plane.request("DELETE", f"/api/v1/namespaces/{namespace}")


def collection_of(bed: dict, group: str, resource: str) -> str:
    plural = resource.split("/")[0]
    found = [c for c in bed["collections"] if c.endswith(f"/{plural}") and f"/apis/{group}/" in c]
    if group == "" and plural == "events":
        return f"/api/v1/namespaces/{bed['namespace']}/events"
    if group == "apiextensions.k8s.io":
        return "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    if group == "" and plural == "namespaces":
        return "/api/v1/namespaces"
    assert len(found) == 1, (group, resource, found)
    return found[0]


def request_for(bed: dict, group: str, resource: str, verb: str, names: list[str]) -> Callable[[str], object]:
    """The request of `verb` on `resource`, as a function of the user making it."""
    plane: cp.LocalControlPlane = bed["plane"]
    collection = collection_of(bed, group, resource)
    name = names[0] if names else (bed["name"] if group != "apiextensions.k8s.io" else
                                   "libvirtmachines.infrastructure.cluster.x-k8s.io")
    subresource = "/" + resource.split("/")[1] if "/" in resource else ""
    item = f"{collection}/{name}{subresource}"
    patch = {"metadata": {"annotations": {"rbac-probe": "1"}}} if not subresource else {"status": {}}
    calls: dict[str, Callable[[str], object]] = {
        "get": lambda user: plane.request("GET", item, as_user=user),
        "list": lambda user: plane.request("GET", collection, as_user=user),
        "watch": lambda user: plane.request("GET", f"{collection}?watch=1&timeoutSeconds=1", as_user=user),
        "patch": lambda user: plane.request("PATCH", item, patch, content_type="application/merge-patch+json",
                                            as_user=user),
        "create": lambda user: plane.request("POST", collection, _new_object(group, resource, bed), as_user=user),
        "delete": lambda user: plane.request("DELETE", f"{collection}/{_throwaway(plane, bed, collection)}",
                                             as_user=user),
    }
    return calls[verb]


def _new_object(group: str, resource: str, bed: dict) -> dict:
    name = f"made-{uuid.uuid4().hex[:6]}"
    if resource == "events":
        return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
                "involvedObject": {"kind": "LibvirtMachine", "name": bed["name"], "namespace": bed["namespace"]},
                "reason": "Probe", "message": "rbac probe", "type": "Normal"}
    assert resource == "ipaddressclaims", resource
    return {"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim", "metadata": {"name": name},
            "spec": {"poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"}}}


def _throwaway(plane: cp.LocalControlPlane, bed: dict, collection: str) -> str:
    """An object made by the admin for a delete to remove (an IPAddressClaim)."""
    body = _new_object("ipam.cluster.x-k8s.io", "ipaddressclaims", bed)
    plane.request("POST", collection, body)
    return body["metadata"]["name"]


def refused(call: Callable[[str], object], user: str) -> bool:
    try:
        call(user)
    except ControlPlaneError as error:
        if error.status == 403:
            return True
        raise
    return False


def settled(call: Callable[[str], object], user: str, want_refused: bool) -> bool:
    """Whether the request ends as wanted within PROPAGATION_S (a new binding takes a moment to be authorized)."""
    deadline = time.monotonic() + PROPAGATION_S
    while True:
        if refused(call, user) == want_refused:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def without(rule_index: int, verb: str) -> dict:
    role = copy.deepcopy(ROLE)
    rule = role["rules"][rule_index]
    rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    if not rule["verbs"]:
        del role["rules"][rule_index]
    role["metadata"] = {"name": f"rbac-probe-{rule_index}-{verb}"}
    return role


CASES = [(index, verb) for index, rule in enumerate(ROLE["rules"]) for verb in rule["verbs"]]


def canary_for(bed: dict, removed_index: int, removed_verb: str) -> Callable[[str], object]:
    """A request of a rule and verb other than the one removed (the first case that is not it)."""
    index, verb = next((i, v) for i, v in CASES if (i, v) != (removed_index, removed_verb)
                       and not ROLE["rules"][i].get("resourceNames") and v in ("get", "list"))
    rule = ROLE["rules"][index]
    return request_for(bed, rule["apiGroups"][0], rule["resources"][0], verb, [])


def test_every_verb_of_every_rule_is_a_request_the_provider_makes(control_plane: cp.LocalControlPlane, bed: dict):
    bed["plane"] = control_plane
    whole = dict(copy.deepcopy(ROLE), metadata={"name": "rbac-probe-whole"})
    control_plane.grant(whole, "rbac-probe-whole")
    tried = []
    for index, verb in CASES:
        rule = ROLE["rules"][index]
        user = f"rbac-probe-{index}-{verb}"
        control_plane.grant(without(index, verb), user)
        # A refusal proves something only once the binding is in force: a request the reduced role still allows
        # must pass first (a binding not yet seen by the authorizer refuses everything).
        canary = canary_for(bed, index, verb)
        assert settled(canary, user, want_refused=False), f"{user}: the reduced role never took effect"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                call = request_for(bed, group, resource, verb, rule.get("resourceNames") or [])
                what = f"rule {index} ({group or 'core'} {resource} {verb}: {needed_by(group, resource, verb)})"
                assert settled(call, "rbac-probe-whole", want_refused=False), f"{what}: refused with the whole role"
                assert settled(call, user, want_refused=True), f"{what}: allowed without it: the rule is not needed"
                tried.append(what)
    print(f"\n[rbac] {len(tried)} requests, each refused without its rule's verb and allowed with the whole role")
    assert len(tried) >= len(CASES)


def test_the_role_reaches_no_secret_and_no_verb_the_provider_does_not_use(control_plane: cp.LocalControlPlane,
                                                                          bed: dict):
    bed["plane"] = control_plane
    whole = dict(copy.deepcopy(ROLE), metadata={"name": "rbac-probe-whole"})
    control_plane.grant(whole, "rbac-probe-whole")
    namespace, name = bed["namespace"], bed["name"]
    machines = f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{namespace}/libvirtmachines"
    denied = {
        "list Secrets": lambda user: control_plane.request("GET", "/api/v1/secrets", as_user=user),
        "get a Secret": lambda user: control_plane.request("GET", f"/api/v1/namespaces/{namespace}/secrets/x",
                                                           as_user=user),
        "create a LibvirtMachine": lambda user: control_plane.request("POST", machines, {
            "apiVersion": meta.API_VERSION, "kind": "LibvirtMachine", "metadata": {"name": "made"},
            "spec": {"image": {"volume": "base.qcow2"}}}, as_user=user),
        "delete a LibvirtMachine": lambda user: control_plane.request("DELETE", f"{machines}/{name}", as_user=user),
        "patch a Machine": lambda user: control_plane.request(
            "PATCH", f"/apis/cluster.x-k8s.io/v1beta2/namespaces/{namespace}/machines/{name}", {},
            content_type="application/merge-patch+json", as_user=user),
        "get another Namespace": lambda user: control_plane.request("GET", f"/api/v1/namespaces/{namespace}",
                                                                   as_user=user),
    }
    assert settled(canary_for(bed, -1, ""), "rbac-probe-whole", want_refused=False), "the role never took effect"
    for what, call in denied.items():
        assert settled(call, "rbac-probe-whole", want_refused=True), f"the role allows: {what}"


# Who makes each request of the leader election Role (operator/election.py, through kube/api.py).
LEASE_NEEDED_BY = {
    "get": "Elector.try_take reads the Lease on every try (standing by, leading) and Elector.release before it",
    "create": "Elector.try_take: the first replica makes the Lease",
    "update": "Elector.try_take renews or takes it over, Elector.release gives it up (resourceVersion-checked)",
}


def test_every_verb_of_the_leader_election_role_is_a_request_the_provider_makes(control_plane: cp.LocalControlPlane):
    namespace = LEADER_ROLE["metadata"]["namespace"]
    control_plane.ensure_namespace(namespace)
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    probe = f"rbac-probe-{uuid.uuid4().hex[:6]}"

    def lease(name: str) -> dict:
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name},
                "spec": {"holderIdentity": "probe", "leaseDurationSeconds": 15}}
    made = [probe]
    control_plane.request("POST", leases, lease(probe))

    def create(user: str) -> object:
        made.append(f"{probe}-{uuid.uuid4().hex[:6]}")
        return control_plane.request("POST", leases, lease(made[-1]), as_user=user)
    calls: dict[str, Callable[[str], object]] = {
        "get": lambda user: control_plane.request("GET", f"{leases}/{probe}", as_user=user),
        "create": create,
        "update": lambda user: control_plane.request("PUT", f"{leases}/{probe}",
                                                     control_plane.request("GET", f"{leases}/{probe}"), as_user=user),
    }
    whole = dict(copy.deepcopy(LEADER_ROLE), metadata={"name": "rbac-probe-lease-whole", "namespace": namespace})
    control_plane.grant(whole, "rbac-probe-lease-whole")
    [rule] = LEADER_ROLE["rules"]
    assert set(rule["verbs"]) == set(LEASE_NEEDED_BY)
    try:
        for verb in rule["verbs"]:
            user = f"rbac-probe-lease-{verb}"
            reduced = copy.deepcopy(whole)
            reduced["metadata"]["name"] = user
            reduced["rules"][0]["verbs"] = [v for v in rule["verbs"] if v != verb]
            control_plane.grant(reduced, user)
            canary = calls["create" if verb == "get" else "get"]
            assert settled(canary, user, want_refused=False), f"{user}: the reduced role never took effect"
            what = f"leases {verb}: {LEASE_NEEDED_BY[verb]}"
            assert settled(calls[verb], "rbac-probe-lease-whole", want_refused=False), f"{what}: refused with the role"
            assert settled(calls[verb], user, want_refused=True), f"{what}: allowed without it: the rule is not needed"
    finally:
        for name in made:
            with contextlib.suppress(ControlPlaneError):
                control_plane.request("DELETE", f"{leases}/{name}")
