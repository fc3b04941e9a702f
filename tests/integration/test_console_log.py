"""`capi-libvirt console-log` against the real API server and a real libvirtd: the serial log of a placed machine is
downloaded over the libvirt connection, whole, its last lines, at most some bytes, or followed; the host is reached through `--host` or through
its LibvirtHost object; every failure is one line on stderr and a nonzero exit, without credentials. The domain need
not exist: the log is written into the pool folder, where the guest's serial port would write it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import pathlib
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import libvirt
import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from capi_libvirt.core import naming, volume_xml
from capi_libvirt.hypervisor import host as host_api
from devenv import control_plane as cp

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MERGE = {"_content_type": "application/merge-patch+json"}
BOOT = b"".join(f"[ {i:4d}.000000] boot line {i}\n".encode() for i in range(300))
JOIN_FAILURE = b"[preflight] error execution phase preflight: couldn't validate the identity of the API Server\n"
LOG = BOOT + JOIN_FAILURE
COMMAND_TIMEOUT_S = 30.0
MIB, CLONE_MIB = 1 << 20, 64


async def console_log(control_plane: cp.LocalControlPlane, *args: str, mount_run_libvirt: pathlib.Path | None = None,
                      ) -> tuple[int, bytes, bytes]:
    """Run the command to its end; (exit code, stdout, stderr).

    `mount_run_libvirt`: run it in a private mount namespace where that folder is /run/libvirt, so the plain
    `qemu:///system` of a LibvirtHost object reaches the test host's daemon (nothing outside the process sees it)."""
    prefix = [] if mount_run_libvirt is None else [
        "unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
        'mount --bind "$0" /run/libvirt && exec "$@"', str(mount_run_libvirt)]
    process = await start(control_plane, *args, prefix=prefix)
    stdout, stderr = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT_S)
    return process.returncode, stdout, stderr


async def start(control_plane: cp.LocalControlPlane, *args: str,
                prefix: Sequence[str] = ()) -> asyncio.subprocess.Process:
    """The command, started as a user would: with the API server's admin kubeconfig, no hosts from the environment."""
    return await asyncio.create_subprocess_exec(
        *prefix, sys.executable, "-m", "capi_libvirt", "console-log", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECONFIG": str(control_plane.kubeconfig_path), "CAPI_LIBVIRT_HOSTS": ""})


def one_error_line(stderr: bytes) -> str:
    lines = stderr.decode().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {stderr.decode()!r}"
    assert lines[0].startswith("capi-libvirt console-log: ")
    return lines[0]


async def make_machine(api_client, namespace: str, host: str, pool: str) -> tuple[str, str]:
    """A LibvirtMachine placed on `host` (status written as the operator's placement writes it); (name, uid)."""
    objects = client.CustomObjectsApi(api_client)
    name = f"m-{uuid.uuid4().hex[:6]}"
    body = await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtMachine", "metadata": {"name": name},
        "spec": {"image": {"volume": "base.qcow2"}, "storagePool": pool, "domainType": "qemu", "memoryMiB": 256}})
    uid = body["metadata"]["uid"]
    await objects.patch_namespaced_custom_object_status(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name, {
        "status": {"host": host, "domainUUID": naming.domain_uuid(uid)}}, **MERGE)
    return name, uid


@contextlib.contextmanager
def serial_log(libvirt_host, namespace: str, name: str, uid: str, content: bytes):
    """The machine's serial log in the host's pool folder, as its serial port writes it; removed afterwards (the
    e2e tests check that the pool holds nothing but the base image)."""
    path = libvirt_host.pool_dir / naming.serial_log_file_name(namespace, name, uid)
    path.write_bytes(content)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
async def no_machine_left(api_client, namespace) -> AsyncIterator[None]:
    """The test's LibvirtMachines deleted, and gone, before its namespace is: no operator runs here, and an operator
    of a later module would otherwise find them in the terminating namespace, put its finalizer on them and keep
    reconciling machines whose images do not exist."""
    yield
    objects = client.CustomObjectsApi(api_client)
    listing = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines")
    for item in listing["items"]:
        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                      item["metadata"]["name"])
    for _ in range(100):
        listing = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines")
        if not listing["items"]:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"LibvirtMachines of {namespace} not gone: {[i['metadata']['name'] for i in listing['items']]}")


@pytest.fixture
async def placed(api_client, namespace, libvirt_host) -> AsyncIterator[tuple[str, pathlib.Path]]:
    """A machine on the session host with LOG as its serial log: ("namespace/name", the log's path)."""
    name, uid = await make_machine(api_client, namespace, libvirt_host.name, libvirt_host.pool_name)
    with serial_log(libvirt_host, namespace, name, uid, LOG) as path:
        yield f"{namespace}/{name}", path


@contextlib.asynccontextmanager
async def libvirt_host_object(api_client, spec: dict) -> AsyncIterator[str]:
    """A LibvirtHost; deleted afterwards (and freed of a finalizer, should an operator of another module have added
    one: it would wait for machines placed on the host)."""
    objects = client.CustomObjectsApi(api_client)
    name = f"console-{uuid.uuid4().hex[:6]}"
    await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": name}, "spec": spec})
    try:
        yield name
    finally:
        await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name)
        with contextlib.suppress(client.exceptions.ApiException):
            await objects.patch_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name,
                                                      {"metadata": {"finalizers": None}}, **MERGE)


def last(lines: int, log: bytes = LOG) -> bytes:
    return b"".join(log.splitlines(keepends=True)[-lines:])


async def test_prints_the_whole_log_its_last_lines_and_at_most_some_bytes(control_plane, libvirt_host, placed):
    machine, _ = placed
    namespace, name = machine.split("/")
    host = f"{libvirt_host.name}={libvirt_host.uri}"
    assert await console_log(control_plane, machine, "--host", host) == (0, LOG, b"")
    assert await console_log(control_plane, "-n", namespace, name, "--host", host, "--tail", "1") == \
        (0, JOIN_FAILURE, b"")
    assert await console_log(control_plane, machine, "--host", host, "--tail", "3") == (0, last(3), b"")
    assert await console_log(control_plane, machine, "--host", host, "--tail", "10000000") == (0, LOG, b"")
    assert await console_log(control_plane, machine, "--host", host, "--limit-bytes", "100") == (0, LOG[:100], b"")
    assert await console_log(control_plane, machine, "--host", host, "--tail", "1", "--limit-bytes", "12") == \
        (0, JOIN_FAILURE[:12], b"")


async def test_the_last_lines_of_a_long_log_are_read_in_growing_windows(control_plane, libvirt_host, api_client,
                                                                          namespace):
    """Far more lines than the first read's window holds (64 KiB): the read grows until it has them all."""
    long_log = b"".join(f"[ {i:6d}.000000] a longer boot line, number {i}\n".encode() for i in range(20000))
    name, uid = await make_machine(api_client, namespace, libvirt_host.name, libvirt_host.pool_name)
    with serial_log(libvirt_host, namespace, name, uid, long_log):
        code, stdout, stderr = await console_log(control_plane, f"{namespace}/{name}", "--tail", "15000",
                                                 "--host", f"{libvirt_host.name}={libvirt_host.uri}")
    assert (code, stderr) == (0, b"") and len(stdout) > 4 * 64 * 1024
    assert stdout == last(15000, long_log)


async def test_follow_prints_what_the_guest_writes_next(control_plane, libvirt_host, placed):
    machine, path = placed
    process = await start(control_plane, machine, "--host", f"{libvirt_host.name}={libvirt_host.uri}",
                          "--tail", "2", "--follow")
    added = b"[  300.5] kubeadm join: retrying\n"
    try:
        assert await asyncio.wait_for(process.stdout.readexactly(len(last(2))), COMMAND_TIMEOUT_S) == last(2)
        with path.open("ab") as log:
            log.write(added)
        assert await asyncio.wait_for(process.stdout.readline(), COMMAND_TIMEOUT_S) == added
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C: how a follow ends
        _, stderr = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT_S)
    assert process.returncode == 0 and stderr == b""


async def test_reaches_the_host_through_its_libvirthost_object(api_client, namespace, control_plane, libvirt_host):
    spec = {"uri": "qemu:///system", "storagePool": libvirt_host.pool_name}  # the default socket, /run/libvirt
    async with libvirt_host_object(api_client, spec) as host:
        name, uid = await make_machine(api_client, namespace, host, libvirt_host.pool_name)
        with serial_log(libvirt_host, namespace, name, uid, LOG):
            code, stdout, stderr = await console_log(control_plane, f"{namespace}/{name}", "--tail", "20",
                                                     mount_run_libvirt=libvirt_host.socket_path.parent)
    assert (code, stdout, stderr) == (0, last(20), b"")


async def test_an_unknown_machine_is_one_clear_error(control_plane, namespace):
    code, stdout, stderr = await console_log(control_plane, f"{namespace}/no-such-machine")
    assert (code, stdout) == (1, b"")
    assert one_error_line(stderr) == f"capi-libvirt console-log: LibvirtMachine {namespace}/no-such-machine not found"


async def test_a_machine_without_a_log_yet_is_one_clear_error(api_client, namespace, control_plane, libvirt_host):
    name, uid = await make_machine(api_client, namespace, libvirt_host.name, libvirt_host.pool_name)
    code, stdout, stderr = await console_log(control_plane, f"{namespace}/{name}",
                                             "--host", f"{libvirt_host.name}={libvirt_host.uri}")
    assert (code, stdout) == (1, b"")
    line = one_error_line(stderr)
    assert f"host {libvirt_host.name}: no serial log {naming.serial_log_file_name(namespace, name, uid)}" in line
    assert "has not started yet" in line


async def test_a_machine_not_placed_yet_is_one_clear_error(api_client, namespace, control_plane):
    objects = client.CustomObjectsApi(api_client)
    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtMachine", "metadata": {"name": "waiting"},
        "spec": {"image": {"volume": "base.qcow2"}}})
    code, stdout, stderr = await console_log(control_plane, f"{namespace}/waiting")
    assert (code, stdout) == (1, b"")
    # With the reason it waits for once a manager (another module's, on the same API server) has looked at it.
    assert re.fullmatch(rf"capi-libvirt console-log: LibvirtMachine {namespace}/waiting is not placed on a host yet"
                        r"( \(WaitingForOwner: waiting for Cluster API to set the owner Machine\))?",
                        one_error_line(stderr)), one_error_line(stderr)


FAKE_PEM = b"-----BEGIN PRIVATE KEY-----\nnot-a-real-key-3f9a1c\n-----END PRIVATE KEY-----\n"


async def test_an_unreachable_host_is_one_clear_error_without_credentials(api_client, namespace, control_plane):
    await client.CoreV1Api(api_client).create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name="host-tls"),
        data={key: base64.b64encode(FAKE_PEM).decode() for key in ("ca.crt", "tls.crt", "tls.key")}))
    spec = {"uri": f"qemu+tls://127.0.0.1:{cp.free_port()}/system",  # loopback, a port nothing listens on
            "credentialsSecretRef": {"name": "host-tls", "namespace": namespace}}
    async with libvirt_host_object(api_client, spec) as host:
        name, _ = await make_machine(api_client, namespace, host, "default")
        code, stdout, stderr = await console_log(control_plane, f"{namespace}/{name}")
    assert (code, stdout) == (1, b"")
    line = one_error_line(stderr)
    assert line.startswith(f"capi-libvirt console-log: host {host}: ")
    assert b"not-a-real-key" not in stderr and b"qemu+tls" not in stderr  # neither credentials nor the URI


async def test_reading_waits_out_a_volume_being_built_in_the_pool(libvirt_host, placed):
    """libvirt refuses a pool refresh while a volume of the pool is being built (the operator making another machine's
    overlay or NoCloud volume; here a clone, slow enough to be seen): the read waits until it is done, not fails."""
    _, path = placed
    suffix = uuid.uuid4().hex[:6]
    source, clone = libvirt_host.pool_dir / f"clone-source-{suffix}.raw", f"clone-{suffix}.raw"
    with source.open("wb") as file:
        for _ in range(CLONE_MIB):
            file.write(b"\x01" * MIB)  # not zeros: libvirt skips holes, and the clone would be over at once
    finished: dict[str, float] = {}

    def build_clone() -> None:
        with libvirt_host.connect() as conn:
            pool = conn.storagePoolLookupByName(libvirt_host.pool_name)
            pool.createXMLFrom(volume_xml.raw_volume_xml(clone, CLONE_MIB * MIB),
                               pool.storageVolLookupByName(source.name), 0)
        finished["at"] = time.monotonic()

    host = host_api.libvirt_host(libvirt_host.name, libvirt_host.uri, None, None)
    cloning = threading.Thread(target=build_clone)
    try:
        with libvirt_host.connect() as conn:
            pool = conn.storagePoolLookupByName(libvirt_host.pool_name)
            pool.refresh(0)  # the source file becomes a volume
            cloning.start()
            while True:  # until libvirt refuses a refresh: the clone is being built
                assert cloning.is_alive(), "the clone was over before a refresh was refused"
                try:
                    pool.refresh(0)
                except libvirt.libvirtError as refused:
                    assert (refused.get_error_code(), refused.get_error_domain()) == \
                        (libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_FROM_STORAGE)
                    break
        chunk = await host.read_serial_log(libvirt_host.pool_name, path.name, 0, None)
        read_at = time.monotonic()
        cloning.join(COMMAND_TIMEOUT_S)
        assert (chunk.data, chunk.end) == (LOG, len(LOG))
        assert read_at >= finished["at"], "the read went on while the clone was being built"
    finally:
        if cloning.is_alive() or cloning.ident is not None:
            cloning.join(COMMAND_TIMEOUT_S)
        source.unlink(missing_ok=True)
        (libvirt_host.pool_dir / clone).unlink(missing_ok=True)
        await asyncio.get_running_loop().run_in_executor(None, host.close)
