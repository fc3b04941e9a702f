"""Fixtures of the real libvirt side: one libvirt host (daemons in their own network namespace) for the session, one
per module for a whole cluster (cluster_host, with the node image in its pool), and the cached guest images their
guests boot (the minimal one, and the Kubernetes node one)."""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from collections.abc import Iterator

import pytest

from devenv import apparmor_check, base_image
from devenv.guest_image import NODE, GuestImage, find_guest_image, image_folder
from devenv.libvirt_host import QEMU_USER, LibvirtHost
from devenv.remote_access import RemoteAccess

from prereq import require

# The session host's subnet; tests that start hosts of their own pick others (each host has its own namespace, so
# overlapping would work too, but distinct subnets keep logs unambiguous).
SESSION_SUBNET = "192.168.122.0/24"
# What makes the name of a test's libvirt host its pytest process's own, fixed (a run killed earlier is cleared at the
# next start) yet apart from the hosts of the pytest processes beside it: `make test` runs the other Pythons' pytest
# beside the main run's xdist workers (gw0, gw1), and the whole cluster's pytest after them.
RUN_SUFFIX = os.environ.get("PYTEST_XDIST_WORKER") or f"py{sys.version_info.major}{sys.version_info.minor}"

def require_libvirt_host_prerequisites() -> None:
    require(os.geteuid() == 0, "root (libvirt hosts create network namespaces)")
    for program in ("libvirtd", "virtlogd", "qemu-system-x86_64", "dnsmasq", "ip", "unshare"):
        require(shutil.which(program) is not None, f"{program} on PATH (apt packages of make deps)")
    require(user_exists(QEMU_USER), f"the user {QEMU_USER} QEMU runs as (made by libvirt-daemon-system, make deps)")
    missing = apparmor_check.programs()
    require(not missing, f"{', '.join(missing)} for the AppArmor check (apparmor and libvirt-daemon-system, make deps)")


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True

@pytest.fixture(scope="session")
def libvirt_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LibvirtHost]:
    """A started libvirt host for the whole session (one per xdist worker); a fixed name per worker (RUN_SUFFIX), so
    a run killed earlier is cleared at start. Its logs (libvirtd, virtlogd, guests' QEMU and serial logs) stay in
    pytest's temporary folder after the run."""
    require_libvirt_host_prerequisites()
    name = f"pytest-session-{RUN_SUFFIX}"
    with LibvirtHost(name, SESSION_SUBNET, log_dir=tmp_path_factory.mktemp("libvirt-host-logs")) as host:
        yield host

@pytest.fixture(scope="session")
def guest_image() -> GuestImage:
    """The guest image of the current recipe, built beforehand by hack/build-guest-image.sh (make guest-image)."""
    image = find_guest_image()
    require(image is not None, f"guest image in {image_folder()} (hack/build-guest-image.sh)")
    assert image is not None
    return image

@pytest.fixture(scope="session")
def base_image_volume(libvirt_host: LibvirtHost, guest_image: GuestImage) -> str:
    """The cached image uploaded once into the session host's pool, as users keep base images: its volume name."""
    with libvirt_host.connect() as conn:
        return base_image.upload_base_image(conn, libvirt_host.pool_name, guest_image)

@pytest.fixture(scope="session")
def node_image() -> GuestImage:
    """The Kubernetes node image of the current recipe and Kubernetes version (containerd, kubelet, kubeadm; it boots
    from its own disk through extlinux, so no kernelBoot), built by `hack/build-guest-image.sh node`."""
    image = find_guest_image(NODE)
    require(image is not None, f"node image in {image_folder(flavor=NODE)} (hack/build-guest-image.sh node)")
    assert image is not None
    return image

@pytest.fixture(scope="session")
def node_base_volume(libvirt_host: LibvirtHost, node_image: GuestImage) -> str:
    """The node image uploaded once into the session host's pool: its volume name (base-node-<recipe-hash>.qcow2)."""
    with libvirt_host.connect() as conn:
        return base_image.upload_base_image(conn, libvirt_host.pool_name, node_image)

@pytest.fixture(scope="module")
def cluster_access(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteAccess]:
    """A libvirt host of its own for a whole cluster (tests/whole_cluster_bed.py), whose NAT network keeps its last
    addresses out of DHCP (the endpoint's), reached over qemu+ssh and qemu+tls (tests/declared_host.py)."""
    from whole_cluster_bed import LINK, RESERVED, SUBNET

    require_libvirt_host_prerequisites()
    for program in ("/usr/sbin/sshd", "ssh", "openssl", "ssh-keygen"):
        require(shutil.which(program) is not None, f"{program} (make test installs it)")
    name = f"pytest-cluster-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    with RemoteAccess(LibvirtHost(name, SUBNET, dhcp_reserved=RESERVED,
                                  log_dir=tmp_path_factory.mktemp("cluster-host-logs")), link_index=LINK) as access:
        yield access

@pytest.fixture(scope="module")
def cluster_host(cluster_access: RemoteAccess) -> LibvirtHost:
    return cluster_access.host

@pytest.fixture(scope="module")
def cluster_base_volume(cluster_host: LibvirtHost, node_image: GuestImage) -> str:
    """The node image in the whole cluster's host's pool."""
    with cluster_host.connect() as conn:
        return base_image.upload_base_image(conn, cluster_host.pool_name, node_image)
