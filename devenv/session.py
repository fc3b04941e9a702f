"""`make run`: the operator against a reachable cluster, or else against a local control plane and libvirt host.

A newcomer without a cluster gets a real kube-apiserver (with the provider's and Cluster API's CRDs) and a real
libvirtd in a network namespace, is told where they are, and watches the operator run against them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import sys

from kubernetes_asyncio import client, config

from capi_libvirt.operator import config as operator_config
from capi_libvirt.operator import main as operator_main
from devenv import base_image, control_plane, guest_image, libvirt_host, paths

log = logging.getLogger(__name__)
REPO = pathlib.Path(__file__).resolve().parents[1]


async def _cluster_reachable() -> bool:
    """True when the kubeconfig of $KUBECONFIG or ~/.kube/config answers within a few seconds."""
    kubeconfig = os.environ.get("KUBECONFIG", str(pathlib.Path.home() / ".kube" / "config"))
    if not pathlib.Path(kubeconfig.split(os.pathsep)[0]).exists():  # noqa: ASYNC240 - one stat, before any work
        return False
    try:
        configuration = client.Configuration()
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        async with client.ApiClient(configuration) as api:
            version = await asyncio.wait_for(client.VersionApi(api).get_code(), timeout=5)
        log.info("using the cluster of %s (Kubernetes %s)", kubeconfig, version.git_version)
        return True
    except Exception as error:  # any failure means "not reachable": fall back to the local environment
        log.info("no reachable cluster in %s (%s); starting a local one", kubeconfig, type(error).__name__)
        return False


def run_dev(namespaces: list[str], force_local: bool = False) -> int:
    if not force_local and asyncio.run(_cluster_reachable()):
        asyncio.run(operator_main.run_operator(namespaces, operator_config=operator_config.from_arguments({})))
        return 0
    crd_dirs = [REPO / "config" / "crd", paths.cluster_api_crd_dir()]
    with control_plane.LocalControlPlane(crd_dirs=crd_dirs) as plane, libvirt_host.LibvirtHost("dev") as host:
        os.environ["KUBECONFIG"] = str(plane.kubeconfig_path)
        image = guest_image.find_guest_image()
        base = "(no cached guest image: run `make guest-image`)"
        if image is not None:
            with host.connect() as conn:
                base = base_image.upload_base_image(conn, host.pool_name, image)
            kernel, initrd = host.boot_files(image)
            base += f" (kernelBoot: kernel {kernel}, initrd {initrd}; domainType: qemu)"
        print(
            "\n=== capi-libvirt local environment ===\n"
            f"  kube-apiserver : {plane.server}\n"
            f"  kubeconfig     : {plane.kubeconfig_path}   (export KUBECONFIG={plane.kubeconfig_path})\n"
            f"  libvirt host   : {host.uri}   (virsh -c '{host.uri}' list --all)\n"
            f"  storage pool   : {host.pool_name}, network: {host.network_name}, netns: {host.netns}\n"
            f"  base image     : {base}\n"
            "  Ctrl-C stops the operator, the API server and the libvirt host.\n",
            file=sys.stderr,
            flush=True,
        )
        cfg = operator_config.OperatorConfig(hosts={host.name: host.uri})
        try:
            asyncio.run(operator_main.run_operator(namespaces, operator_config=cfg))
        except KeyboardInterrupt:
            pass
    return 0
