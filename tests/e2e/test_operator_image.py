"""The operator image as users run it: built from the Dockerfile (make image), installed from the components clusterctl
makes of our release, run as its Deployment says, logged in with its ServiceAccount, provisioning over qemu+ssh.

What is proved:
- `clusterctl generate provider --infrastructure libvirt` output, applied to the API server, is everything the
  manager needs: Namespace, CRDs, ServiceAccount, ClusterRole and binding, leader election Role and binding, Deployment;
- the Deployment's container, run from the built image by podman (devenv.pod_runner, the kubelet's stand-in), starts
  as a non-root user, logs in with the ServiceAccount token and CA at the in-cluster paths (no kubeconfig anywhere),
  takes the leader election Lease, and reports ready on its readinessProbe;
- it reaches a LibvirtHost over qemu+ssh with the key and known_hosts of the host's credentials Secret (the host key
  verified by the ssh client inside the image), and provisions a machine that boots and runs its bootstrap data;
- deleting the machine leaves nothing on the host; SIGTERM ends the container with exit code 0; its log holds no key
  material and no bootstrap data.
"""

from __future__ import annotations

import base64
import pathlib
import shutil
import uuid

import pytest
import yaml
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from capi_libvirt.core import naming
from clusterctl_cli import VERSION, clusterctl
from devenv import base_image, capi_objects, pod_runner
from devenv import remote_access as ra
from devenv.libvirt_host import LibvirtHost
from guests import host_access, host_objects, machine_spec

from prereq import require
from waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SUBNET, LINK = "192.168.154.0/24", 154
HOST = "kvm-image"
PROVISION_DEADLINE_S = 600.0
DELETE_DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def ssh_host(guest_image):
    for program in ("/usr/sbin/sshd", "ssh", "openssl", "ssh-keygen"):
        require(shutil.which(program) is not None, f"{program} (make test installs it)")
    with ra.RemoteAccess(LibvirtHost("e2e-image", SUBNET), link_index=LINK) as access:
        with access.host.connect() as conn:
            volume = base_image.upload_base_image(conn, access.host.pool_name, guest_image)
        yield access, volume


async def test_the_image_installed_from_the_components_provisions_over_qemu_ssh_with_its_service_account(
        control_plane, api_client, namespace, repository, operator_image, ssh_host, guest_image, tmp_path):
    access, volume = ssh_host
    host = access.host
    components = [d for d in yaml.safe_load_all(clusterctl(
        tmp_path, repository, "generate", "provider", "--infrastructure", f"libvirt:{VERSION}").stdout) if d]
    [deployment] = [d for d in components if d["kind"] == "Deployment"]
    [manager] = deployment["spec"]["template"]["spec"]["containers"]
    assert manager["image"] == operator_image, "the components name the image make image built"
    applied = control_plane.apply_objects(components)
    print(f"\n[image] applied {len(applied)} objects of the components; image {operator_image}")

    objects, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    # The host's credentials in the provider's namespace (the components' RoleBinding lets the ServiceAccount read
    # them); the test namespace's bootstrap Secret through a RoleBinding there, as the cluster templates carry it.
    provider_namespace = deployment["metadata"]["namespace"]
    account = {"kind": "ServiceAccount", "namespace": provider_namespace,
               "name": deployment["spec"]["template"]["spec"]["serviceAccountName"]}
    control_plane.bind_in_namespace(meta.SECRETS_CLUSTER_ROLE, namespace, account)
    await core.create_namespaced_secret(provider_namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name=HOST), data={
            "ssh-privatekey": base64.b64encode(access.ssh_key.read_bytes()).decode(),
            "known_hosts": base64.b64encode(access.known_hosts.read_bytes()).decode()}))
    await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": HOST},
        "spec": {"uri": f"qemu+ssh://root@{access.address}/system", "storagePool": host.pool_name,
                 "access": host_access(machine_spec(host, guest_image, volume)),
                 "credentialsSecretRef": {"name": HOST, "namespace": provider_namespace}}})
    marker = f"marker-image-{uuid.uuid4().hex[:10]}"
    pod = pod_runner.PodmanPod(control_plane, deployment["metadata"]["namespace"], deployment["metadata"]["name"],
                               tmp_path / "pod")
    try:
        pod.start()
        assert pod_runner.is_non_root(pod_runner.image_user(operator_image))
        pod.wait_ready()

        async def host_reachable():
            body = await objects.get_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", HOST)
            return body.get("status", {}).get("reachable")
        assert await wait_until("the host reachable from the container", host_reachable, 90)

        await capi_objects.create_cluster(api_client, namespace, "image", infrastructure_kind="ProxmoxCluster")
        made = await capi_objects.create_machine(
            api_client, namespace, "image", f"from-image-{uuid.uuid4().hex[:5]}", capi_objects.marker_user_data(marker),
            machine_spec(host, guest_image, volume) | {"host": HOST})

        async def get():
            return await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                              made.libvirt_machine)

        async def provisioned():
            assert pod.running(), f"the container exited:\n{pod.logs()[-4000:]}"
            body = await get()
            return body if body.get("status", {}).get("initialization", {}).get("provisioned") else None

        body = await wait_until("the machine provisioned by the container", provisioned, PROVISION_DEADLINE_S, 1.0)
        uid = body["metadata"]["uid"]
        domain_uuid = naming.domain_uuid(uid)
        assert body["spec"]["providerID"] == f"libvirt://{HOST}/{domain_uuid}"
        assert [a for a in body["status"]["addresses"] if a["address"].startswith("192.168.154.")]
        serial_log = pathlib.Path(host.pool_dir) / naming.serial_log_file_name(namespace, made.machine, uid)

        async def marker_logged():
            return serial_log.exists() and marker in serial_log.read_text(errors="replace")
        await wait_until("the bootstrap marker on the console", marker_logged, PROVISION_DEADLINE_S, 2.0)

        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                      made.libvirt_machine)

        async def gone():
            try:
                await get()
                return False
            except client.exceptions.ApiException as error:
                return error.status == 404
        await wait_until("the machine deleted by the container", gone, DELETE_DEADLINE_S)
        await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", HOST)

        async def host_gone():
            try:
                await objects.get_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", HOST)
                return False
            except client.exceptions.ApiException as error:
                return error.status == 404
        await wait_until("the LibvirtHost released", host_gone, DELETE_DEADLINE_S)

        assert pod.terminate() == 0, f"SIGTERM: the manager did not exit cleanly:\n{pod.logs()[-4000:]}"
        logs = pod.logs()
        print(f"[image] container log: {len(logs.splitlines())} lines")
        assert "role: leader" in logs, f"the container did not take its Lease:\n{logs[-2000:]}"
        key = access.ssh_key.read_text()
        secret_line = next(line for line in key.splitlines() if line and not line.startswith("-----"))
        assert secret_line not in logs and marker not in logs
    finally:
        pod.stop()
        await core.delete_namespaced_secret(HOST, provider_namespace)
        # The shared API server gets back what it had: other tests apply these components with other field managers.
        # The ClusterRole stays: it is config/rbac's, which the session's operator user is bound to (OPERATOR_USER).
        control_plane.delete_objects(components, keep=("CustomResourceDefinition", "Namespace", "ClusterRole"))

    names = [naming.overlay_volume_name(namespace, made.machine, uid), naming.nocloud_volume_name(namespace, made.machine, uid),
             naming.serial_log_file_name(namespace, made.machine, uid)]
    assert host_objects(host, domain_uuid, names) == []
