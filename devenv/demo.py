"""`make demo`: one machine's whole life on a local API server and libvirt host, narrated as it happens.

It plays Cluster API's part (a Cluster, a bootstrap Secret, a Machine and its LibvirtMachine), runs the operator,
prints each phase the machine goes through until the VM has booted and cloud-init ran the bootstrap data, then
deletes the machine and shows the host clean.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import sys
import time
import uuid

from kubernetes_asyncio import client, config

from capi_libvirt.api import meta
from capi_libvirt.core import conditions, naming
from capi_libvirt.operator import config as operator_config
from capi_libvirt.operator import main as operator_main
from devenv import base_image, capi_objects, control_plane, guest_image, libvirt_host, paths

REPO = pathlib.Path(__file__).resolve().parents[1]
NAMESPACE, CLUSTER, MACHINE = "demo", "demo", "worker-0"
DEADLINE_S = 900.0


def say(text: str, started: float) -> None:
    print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)


def machine_spec(host: libvirt_host.LibvirtHost, image: guest_image.GuestImage, base_volume: str) -> dict:
    kernel, initrd = host.boot_files(image)
    return {
        "image": {"volume": base_volume},
        "storagePool": host.pool_name,
        "domainType": "qemu",  # software emulation: works without /dev/kvm
        "machineType": "pc",
        "cpus": 1,
        "memoryMiB": 256,
        "diskGiB": 2,
        "interfaces": [{"network": host.network_name}],
        "kernelBoot": {"kernel": kernel, "initrd": initrd},
    }


async def run_with_operator(plane: control_plane.LocalControlPlane, host: libvirt_host.LibvirtHost,
                            image: guest_image.GuestImage, base_volume: str) -> int:
    """The operator and the narration side by side; whichever ends first (an error, Ctrl-C) ends the demo."""
    os.environ["KUBECONFIG"] = str(plane.kubeconfig_path)
    stop = asyncio.Event()
    operator = asyncio.create_task(operator_main.run_operator(
        operator_config=operator_config.OperatorConfig(hosts={host.name: host.uri}), stop_flag=stop))
    narration = asyncio.create_task(narrate(plane, host, image, base_volume))
    await asyncio.wait({operator, narration}, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    if not narration.done():
        narration.cancel()
        print("the operator stopped before the demo finished", file=sys.stderr)
    for task in (operator, narration):
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=30)
    return narration.result() if not narration.cancelled() else 1


def what_is_on_the_host(host: libvirt_host.LibvirtHost, base_volume: str) -> tuple[list[str], list[str]]:
    """Domains, and volumes besides the base image (blocking: libvirt calls; run it in a thread)."""
    with host.connect() as conn:
        domains = [d.name() for d in conn.listAllDomains()]
        pool = conn.storagePoolLookupByName(host.pool_name)
        pool.refresh(0)
        return domains, [v for v in pool.listVolumes() if v != base_volume]


async def narrate(plane: control_plane.LocalControlPlane, host: libvirt_host.LibvirtHost,
                  image: guest_image.GuestImage, base_volume: str) -> int:
    started = time.monotonic()
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(plane.kubeconfig_path), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
        await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        marker = f"hello-from-{uuid.uuid4().hex[:8]}"
        say(f"creating Cluster {CLUSTER}, bootstrap Secret, Machine and LibvirtMachine {MACHINE} (as Cluster API would)",
            started)
        await capi_objects.create_cluster(api, NAMESPACE, CLUSTER)
        await capi_objects.create_machine(api, NAMESPACE, CLUSTER, MACHINE, capi_objects.marker_user_data(marker),
                                          machine_spec(host, image, base_volume))
        get = lambda: objects.get_namespaced_custom_object(  # noqa: E731
            meta.GROUP, meta.VERSION, NAMESPACE, "libvirtmachines", MACHINE)
        seen, body = None, {}
        while time.monotonic() - started < DEADLINE_S:
            body = await get()
            status = body.get("status", {})
            provisioned = conditions.get_condition(status.get("conditions"), conditions.PROVISIONED) or {}
            now = (provisioned.get("reason"), status.get("state"), tuple(a["address"] for a in status.get("addresses", [])))
            if now != seen:
                say(f"phase {provisioned.get('reason', '-')}: {provisioned.get('message') or ''} "
                    f"[state={status.get('state', '-')}, addresses={', '.join(now[2]) or '-'}]", started)
                seen = now
            if status.get("initialization", {}).get("provisioned"):
                break
            await asyncio.sleep(0.5)
        else:
            say("the machine did not provision in time", started)
            return 1
        say(f"provisioned: providerID {body['spec']['providerID']}", started)
        uid = body["metadata"]["uid"]
        serial_log = host.pool_dir / naming.serial_log_file_name(NAMESPACE, MACHINE, uid)
        while marker not in (serial_log.read_text(errors="replace") if serial_log.exists() else ""):
            if time.monotonic() - started > DEADLINE_S:
                say("the bootstrap data did not run in time", started)
                return 1
            await asyncio.sleep(1)
        say(f"cloud-init ran the bootstrap data inside the VM: '{marker}' is on its serial console", started)
        say(f"deleting LibvirtMachine {MACHINE}", started)
        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, NAMESPACE, "libvirtmachines", MACHINE)
        while True:
            try:
                await get()
            except client.exceptions.ApiException as error:
                if error.status == 404:
                    break
                raise
            await asyncio.sleep(0.5)
        domains, volumes = await asyncio.to_thread(what_is_on_the_host, host, base_volume)
        say(f"deleted; host {host.name} now has domains={domains or 'none'}, volumes besides the base image="
            f"{volumes or 'none'}", started)
    return 0 if not domains and not volumes else 1


def run_demo() -> int:
    image = guest_image.ensure_guest_image()
    crd_dirs = [REPO / "config" / "crd", paths.cluster_api_crd_dir()]
    with control_plane.LocalControlPlane(crd_dirs=crd_dirs) as plane, libvirt_host.LibvirtHost("demo") as host:
        print(f"kube-apiserver {plane.server} (KUBECONFIG={plane.kubeconfig_path}); libvirt host {host.uri}",
              file=sys.stderr, flush=True)
        with host.connect() as conn:
            base_volume = base_image.upload_base_image(conn, host.pool_name, image)
        return asyncio.run(run_with_operator(plane, host, image, base_volume))
