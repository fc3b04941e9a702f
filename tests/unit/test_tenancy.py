"""Tenant boundaries (core.tenancy, and placement with refusals): what a LibvirtHost's spec.access allows a machine of a
namespace, the safe defaults, and that nothing outside the lists gets through (host files, bridges, pools, networks,
images, other tenants' machine volumes, other hosts)."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from capi_libvirt.api import meta, reasons, release, templates, v1alpha1, v1alpha1_host
from capi_libvirt.core import naming, tenancy
from capi_libvirt.core.placement import HostLoad, NoHost, Placed, Request, choose_host

pytestmark = pytest.mark.unit
REPO = pathlib.Path(__file__).resolve().parents[2]


def access(**fields) -> v1alpha1_host.HostAccess:
    return v1alpha1_host.HostAccess.model_validate(fields)


def spec(**fields) -> v1alpha1.LibvirtMachineSpec:
    return v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "ubuntu.qcow2"}, **fields})


def refusal(host_access: v1alpha1_host.HostAccess, machine: v1alpha1.LibvirtMachineSpec, namespace: str = "team-a",
            host_pool: str = "default") -> tenancy.Refusal | None:
    return tenancy.refusal("kvm1", host_access, host_pool, namespace, machine)


FIRST_DAY = access(images=["ubuntu.qcow2"])  # the defaults, plus the one image the admin uploaded


def test_first_day_defaults_allow_the_default_pool_and_network_in_any_namespace():
    """A single-tenant user's first day: the default pool, the default NAT network, the listed image, any namespace."""
    assert refusal(FIRST_DAY, spec()) is None
    assert refusal(FIRST_DAY, spec(), namespace="anything") is None


@pytest.mark.parametrize(("machine", "field", "words"), [
    (spec(kernelBoot={"kernel": "/etc/shadow"}), "hostPaths", "kernelBoot.kernel '/etc/shadow'"),
    (spec(kernelBoot={"kernel": "/boot/vmlinuz", "initrd": "/root/.ssh/id_ed25519"}), "hostPaths",
     "kernelBoot.kernel '/boot/vmlinuz'"),
    (spec(interfaces=[{"bridge": "br0"}]), "bridges", "interfaces[0].bridge 'br0'"),
    (spec(interfaces=[{"network": "default"}, {"network": "storage-net"}]), "networks",
     "interfaces[1].network 'storage-net'"),
    (spec(storagePool="vms"), "storagePools", "storagePool 'vms'"),
    (spec(image={"volume": "ubuntu.qcow2", "pool": "isos"}), "storagePools", "image.pool 'isos'"),
    (spec(image={"volume": "admin-vm.qcow2"}), "images", "image.volume 'admin-vm.qcow2'"),
])
def test_the_defaults_refuse_what_is_not_listed(machine, field, words):
    refused = refusal(FIRST_DAY, machine)
    assert refused is not None and refused.field == field
    assert words in refused.message and "kvm1" in refused.message
    assert f"spec.access.{field}" in refused.message  # where the host's admin would allow it


def test_a_namespace_not_listed_is_refused_without_naming_the_others():
    host_access = access(namespaces=["team-a", "prod-*"], images=["*"])
    assert refusal(host_access, spec(), namespace="team-a") is None
    assert refusal(host_access, spec(), namespace="prod-eu") is None
    refused = refusal(host_access, spec(), namespace="team-b")
    assert refused is not None and refused.field == "namespaces"
    assert "team-b" in refused.message and "team-a" not in refused.message and "prod" not in refused.message


def test_listed_things_are_allowed():
    host_access = access(storagePools=["default", "fast-*"], networks=["default", "lab"], bridges=["br-tenants"],
                         images=["ubuntu-*.qcow2"], hostPaths=["/var/lib/capi-kernels/"])
    machine = spec(storagePool="fast-1", image={"volume": "ubuntu-24.04.qcow2", "pool": "default"},
                   interfaces=[{"network": "lab"}, {"bridge": "br-tenants"}],
                   kernelBoot={"kernel": "/var/lib/capi-kernels/vmlinuz", "initrd": "/var/lib/capi-kernels/initrd.img"})
    assert refusal(host_access, machine) is None


def test_the_hosts_own_pool_is_the_default_pool():
    assert refusal(FIRST_DAY, spec(storagePool="tenants"), host_pool="tenants") is None
    assert refusal(FIRST_DAY, spec(storagePool="default"), host_pool="tenants").field == "storagePools"


@pytest.mark.parametrize("path", [
    "/var/lib/capi-kernels/../../../etc/shadow", "/var/lib/capi-kernels/./vmlinuz", "/var/lib/capi-kernels//vmlinuz",
    "/var/lib/capi-kernels/", "/var/lib/capi-kernels", "/var/lib/capi-kernels-evil/vmlinuz", "relative/vmlinuz",
])
def test_host_paths_are_compared_as_written_never_escaping_the_folder(path):
    assert not tenancy.path_under(path, ["/var/lib/capi-kernels/"])


def test_a_path_inside_a_listed_folder_is_allowed():
    assert tenancy.path_under("/var/lib/capi-kernels/6.1/vmlinuz", ["/var/lib/capi-kernels/"])


def test_another_machines_volumes_are_never_a_base_image_even_with_every_image_allowed():
    """Another tenant's disk, its NoCloud ISO (its bootstrap data) and its serial log, by the names the provider gives."""
    uid = "0b9e5a4e-6c55-4d43-9d55-33b1d6a5d0a1"
    for volume in (naming.overlay_volume_name("team-b", "db-0", uid), naming.nocloud_volume_name("team-b", "db-0", uid),
                   naming.serial_log_file_name("team-b", "db-0", uid)):
        refused = refusal(access(images=["*"]), spec(image={"volume": volume}))
        assert refused is not None and "never a base image" in refused.message, volume


def test_the_access_lists_are_validated_by_the_schema():
    for bad in ({"hostPaths": ["/"]}, {"hostPaths": ["/boot"]}, {"hostPaths": ["boot/"]}, {"bridges": ["br 0"]}):
        with pytest.raises(ValueError):
            access(**bad)


# -- placement over refusals -------------------------------------------------------------------------------------

def load(name: str, refusal: str | None = None, **fields) -> HostLoad:
    return HostLoad(**{"name": name, "healthy": True, "cpus": 8, "memory_mib": 16384, "refusal": refusal, **fields})


SMALL = Request(cpus=2, memory_mib=2048)


def test_placement_only_considers_hosts_that_allow_the_machine():
    # b has far more room, but refuses the machine: a is chosen.
    hosts = [load("a", allocated_memory_mib=8000), load("b", refusal="host b does not allow namespace team-a")]
    assert choose_host(SMALL, hosts) == Placed("a", None)


def test_no_host_allowing_the_machine_is_tenant_not_allowed():
    result = choose_host(SMALL, [load("a", refusal="no a"), load("b", refusal="no b")])
    assert isinstance(result, NoHost) and result.reason == reasons.TENANT_NOT_ALLOWED == reasons.TENANT_NOT_ALLOWED
    assert "no a" in result.message and "no b" in result.message


def test_a_pinned_host_that_refuses_is_tenant_not_allowed_even_when_unreachable():
    request = Request(cpus=2, memory_mib=2048, pinned_host="b")
    result = choose_host(request, [load("a"), load("b", refusal="host b does not allow namespace team-a",
                                                    healthy=False)])
    assert isinstance(result, NoHost) and result.reason == reasons.TENANT_NOT_ALLOWED
    assert "host b does not allow namespace team-a" in result.message


def test_capacity_messages_name_only_the_hosts_that_allow_the_machine():
    result = choose_host(Request(cpus=64, memory_mib=2048), [load("a"), load("secret-b", refusal="no")])
    assert isinstance(result, NoHost) and result.reason == reasons.INSUFFICIENT_CAPACITY
    assert "secret-b" not in result.message


# -- Secrets only through RoleBindings ---------------------------------------------------------------------------

def test_no_cluster_role_binding_gives_the_provider_secrets():
    """The release's components: whatever a ClusterRoleBinding binds grants no Secrets; the Secrets ClusterRole is
    bound by one RoleBinding, in the provider's namespace."""
    documents = release.kustomize(REPO / "config" / "default")
    roles = {d["metadata"]["name"]: d for d in documents if d["kind"] == "ClusterRole"}
    for binding in (d for d in documents if d["kind"] == "ClusterRoleBinding"):
        for rule in roles[binding["roleRef"]["name"]].get("rules", []):
            assert "secrets" not in rule.get("resources", []) and "*" not in rule.get("resources", []), binding
    secrets_role = roles[meta.SECRETS_CLUSTER_ROLE]
    assert secrets_role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    [binding] = [d for d in documents if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"]
    leader_election = [d for d in documents if d["kind"] == "Role"]  # the only Role: Leases, no Secrets
    assert [rule["resources"] for role in leader_election for rule in role["rules"]] == [["leases"]]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": meta.SECRETS_CLUSTER_ROLE}
    assert binding["metadata"]["namespace"] == meta.PROVIDER_NAMESPACE
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": meta.PROVIDER_SERVICE_ACCOUNT,
                                    "namespace": meta.PROVIDER_NAMESPACE}]


@pytest.mark.parametrize("flavor", sorted(templates.FLAVORS))
def test_every_cluster_template_binds_secrets_in_its_namespace_only(flavor):
    [binding] = [d for d in templates.FLAVORS[flavor]() if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] == templates.NAMESPACE
    assert binding["roleRef"]["name"] == meta.SECRETS_CLUSTER_ROLE
    assert binding["subjects"][0]["name"] == meta.PROVIDER_SERVICE_ACCOUNT
    assert yaml.safe_load(yaml.safe_dump(binding)) == binding


def test_the_provider_namespace_comes_from_the_pod(monkeypatch, tmp_path):
    """Host credentials must be in the provider's namespace: $POD_NAMESPACE (the Deployment's downward API), else the
    ServiceAccount's namespace file, else capi-libvirt-system."""
    from capi_libvirt.kube import kubeconfig
    from capi_libvirt.operator import config

    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_NAMESPACE", str(tmp_path / "namespace"))
    monkeypatch.delenv(config.NAMESPACE_ENV, raising=False)
    assert config.provider_namespace() == meta.PROVIDER_NAMESPACE
    (tmp_path / "namespace").write_text("capi-system-2\n")
    assert config.provider_namespace() == "capi-system-2"
    monkeypatch.setenv(config.NAMESPACE_ENV, "from-env")
    assert config.provider_namespace() == "from-env"
    assert config.from_arguments({}).provider_namespace == "from-env"
