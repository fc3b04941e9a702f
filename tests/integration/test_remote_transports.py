"""A libvirt host reached over qemu+tls and qemu+ssh (and qemu+libssh) with every check on: the right credentials
connect, and a wrong CA, a client certificate the host does not accept, a wrong or unknown host key or an
unauthorized key are refused quickly, with a libvirt error that shows no key material."""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator

import libvirt
import pytest

from devenv.libvirt_host import LibvirtHost, process_alive
from devenv.remote_access import (
    RemoteAccess,
    issue_certificate,
    known_hosts_line,
    make_ca,
    ssh_keygen,
)

from fixtures_libvirt import require_libvirt_host_prerequisites
from prereq import require

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REFUSAL_WITHIN_S = 10.0  # a refusal is an error right away, never a prompt or a hang


def require_remote_prerequisites() -> None:
    require_libvirt_host_prerequisites()
    for program in ("sshd", "ssh", "ssh-keygen", "openssl", "nsenter", "virt-ssh-helper"):
        require(shutil.which(program) is not None, f"{program} on PATH (apt packages of make deps)")


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteAccess]:
    require_remote_prerequisites()
    host = LibvirtHost("tr-remote", "192.168.140.0/24", log_dir=tmp_path_factory.mktemp("tr-remote-logs"))
    with RemoteAccess(host, link_index=140) as access:
        yield access


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A CA and an SSH host key of someone else."""
    folder = tmp_path_factory.mktemp("tr-rogue")
    folder.chmod(0o700)
    make_ca(folder / "cakey.pem", folder / "cacert.pem", "rogue CA")
    ssh_keygen(folder / "ssh_host_key", "rogue host")
    return folder


def client_folder(parent: pathlib.Path, name: str, **files: pathlib.Path | str) -> pathlib.Path:
    """A private client folder; each file copied from a path or written from a string."""
    folder = parent / name
    folder.mkdir(mode=0o700)
    for file, source in files.items():
        target = folder / file.replace("_dot_", ".")
        if isinstance(source, pathlib.Path):
            shutil.copy(source, target)
        else:
            target.write_text(source)
    return folder


def secret_texts(*keys: pathlib.Path) -> list[str]:
    """The secret part of each private key file (PEM or OpenSSH), line by line, to look for in error messages."""
    return [line for key in keys for line in key.read_text().splitlines() if line and not line.startswith("-----")]


def assert_refused(uri: str, code: int, domain: int, reason: str, *, secrets: list[str]) -> libvirt.libvirtError:
    started = time.monotonic()
    with pytest.raises(libvirt.libvirtError) as caught:
        libvirt.open(uri).close()
    elapsed = time.monotonic() - started
    error = caught.value
    assert (error.get_error_code(), error.get_error_domain()) == (code, domain), str(error)
    assert reason in str(error)
    assert elapsed < REFUSAL_WITHIN_S
    assert not [secret for secret in secrets if secret in str(error)], "key material in the error message"
    return error


def lists_the_pool(uri: str, remote: RemoteAccess) -> None:
    with libvirt.open(uri) as conn:
        assert remote.host.pool_name in conn.listStoragePools()
        assert conn.storagePoolLookupByName(remote.host.pool_name).isActive()


# -- TLS ------------------------------------------------------------------------------------------------------------

def test_tls_with_the_hosts_ca_and_client_certificate_lists_the_pool(remote: RemoteAccess) -> None:
    assert remote.tls_uri() == f"qemu+tls://198.18.140.2/system?pkipath={remote.client_dir}"
    lists_the_pool(remote.tls_uri(), remote)


def test_tls_client_trusting_another_ca_refuses_the_server(remote: RemoteAccess, rogue: pathlib.Path,
                                                           tmp_path: pathlib.Path) -> None:
    # The client's own certificate comes from the CA it trusts (libvirt checks that first, locally).
    issue_certificate(rogue / "cacert.pem", rogue / "cakey.pem", tmp_path / "key.pem", tmp_path / "cert.pem",
                      remote.client_dn)
    pki = client_folder(tmp_path, "pki", cacert_dot_pem=rogue / "cacert.pem",
                        clientcert_dot_pem=tmp_path / "cert.pem", clientkey_dot_pem=tmp_path / "key.pem")
    assert_refused(remote.tls_uri(pki), libvirt.VIR_ERR_AUTH_FAILED, libvirt.VIR_FROM_RPC,
                   "Failed to verify peer's certificate", secrets=secret_texts(pki / "clientkey.pem"))


def test_tls_server_refuses_a_client_certificate_of_another_ca(remote: RemoteAccess, rogue: pathlib.Path,
                                                               tmp_path: pathlib.Path) -> None:
    # The client trusts both CAs, so the server's certificate passes and so does its own local check.
    issue_certificate(rogue / "cacert.pem", rogue / "cakey.pem", tmp_path / "key.pem", tmp_path / "cert.pem",
                      remote.client_dn)
    both_cas = (remote.client_dir / "cacert.pem").read_text() + (rogue / "cacert.pem").read_text()
    pki = client_folder(tmp_path, "pki", cacert_dot_pem=both_cas,
                        clientcert_dot_pem=tmp_path / "cert.pem", clientkey_dot_pem=tmp_path / "key.pem")
    assert_refused(remote.tls_uri(pki), libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC,
                   "Unable to read TLS confirmation", secrets=secret_texts(pki / "clientkey.pem"))
    assert "authentication failed: Failed to verify peer's certificate" in remote.host.libvirtd_log.read_text()


def test_tls_server_refuses_a_client_not_on_its_allowed_dn_list(remote: RemoteAccess, tmp_path: pathlib.Path) -> None:
    issue_certificate(remote.client_dir / "cacert.pem", remote.server_dir / "cakey.pem", tmp_path / "key.pem",
                      tmp_path / "cert.pem", "CN=someone else,O=capi-libvirt")
    pki = client_folder(tmp_path, "pki", cacert_dot_pem=remote.client_dir / "cacert.pem",
                        clientcert_dot_pem=tmp_path / "cert.pem", clientkey_dot_pem=tmp_path / "key.pem")
    assert_refused(remote.tls_uri(pki), libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC,
                   "Unable to read TLS confirmation", secrets=secret_texts(pki / "clientkey.pem"))
    assert "not on the list of allowed clients" in remote.host.libvirtd_log.read_text()


# -- SSH ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("transport", ["ssh", "libssh"])
def test_ssh_with_the_hosts_known_hosts_lists_the_pool(remote: RemoteAccess, transport: str) -> None:
    uri = remote.ssh_uri() if transport == "ssh" else remote.libssh_uri()
    assert uri.startswith(f"qemu+{transport}://root@198.18.140.2/system?keyfile={remote.ssh_key}&")
    lists_the_pool(uri, remote)


@pytest.mark.parametrize("transport", ["ssh", "ssh, no_verify=1", "libssh"])
def test_ssh_refuses_a_host_key_other_than_the_known_one(remote: RemoteAccess, rogue: pathlib.Path,
                                                         tmp_path: pathlib.Path, transport: str) -> None:
    client = client_folder(tmp_path, "client", id=remote.ssh_key,
                           known_hosts=known_hosts_line(remote.address, rogue / "ssh_host_key.pub"))
    if transport == "libssh":
        assert_refused(remote.libssh_uri(client / "id"), libvirt.VIR_ERR_AUTH_FAILED, libvirt.VIR_FROM_LIBSSH,
                       "SSH HOST KEY VERIFICATION FAILED", secrets=secret_texts(client / "id"))
        return
    uri = remote.ssh_uri(client / "id")
    if transport == "ssh, no_verify=1":  # libvirt then adds -o StrictHostKeyChecking=no; the wrapper's own wins
        uri = uri.replace("no_verify=0", "no_verify=1")
    error = assert_refused(uri, libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC, "Host key verification failed",
                           secrets=secret_texts(client / "id"))
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in str(error)
    assert (client / "known_hosts").read_text() == known_hosts_line(remote.address, rogue / "ssh_host_key.pub")


@pytest.mark.parametrize("transport", ["ssh", "libssh"])
def test_ssh_refuses_an_unknown_host_without_asking(remote: RemoteAccess, tmp_path: pathlib.Path,
                                                    transport: str) -> None:
    client = client_folder(tmp_path, "client", id=remote.ssh_key, known_hosts="")
    if transport == "ssh":
        assert_refused(remote.ssh_uri(client / "id"), libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC,
                       "Host key verification failed", secrets=secret_texts(client / "id"))
    else:
        assert_refused(remote.libssh_uri(client / "id"), libvirt.VIR_ERR_LIBSSH, libvirt.VIR_FROM_LIBSSH,
                       "Can't verify the session host key", secrets=secret_texts(client / "id"))
    assert (client / "known_hosts").read_text() == ""  # nothing learnt on first use


@pytest.mark.parametrize("transport", ["ssh", "libssh"])
def test_ssh_refuses_a_key_that_is_not_authorized(remote: RemoteAccess, tmp_path: pathlib.Path,
                                                  transport: str) -> None:
    client = client_folder(tmp_path, "client", known_hosts=remote.known_hosts)
    ssh_keygen(client / "id", "not authorized")
    if transport == "ssh":
        assert_refused(remote.ssh_uri(client / "id"), libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC,
                       "Permission denied (publickey)", secrets=secret_texts(client / "id"))
    else:
        assert_refused(remote.libssh_uri(client / "id"), libvirt.VIR_ERR_LIBSSH, libvirt.VIR_FROM_LIBSSH,
                       "Access denied for 'publickey'", secrets=secret_texts(client / "id"))


def test_plain_qemu_ssh_passes_the_key_but_not_known_hosts_to_ssh(remote: RemoteAccess,
                                                                   tmp_path: pathlib.Path) -> None:
    """Why ssh_uri names a wrapper: libvirt gives OpenSSH `-i keyfile` but drops known_hosts=, so plain ssh would
    check the host key against the user's ~/.ssh/known_hosts. Recorded with a stand-in ssh that connects nowhere."""
    recorded = tmp_path / "argv"
    fake_ssh = tmp_path / "ssh"
    fake_ssh.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {recorded}\nexit 255\n')
    fake_ssh.chmod(0o700)
    uri = remote.ssh_uri(wrapper=False) + f"&command={fake_ssh}"
    with pytest.raises(libvirt.libvirtError):
        libvirt.open(uri)
    argv = recorded.read_text().splitlines()
    assert argv[argv.index("-i") + 1] == str(remote.ssh_key)
    assert argv[argv.index("BatchMode=yes") - 1:argv.index("BatchMode=yes") + 1] == ["-o", "BatchMode=yes"]
    assert not [arg for arg in argv if "known_hosts" in arg.lower() or "KnownHosts" in arg]
    assert "StrictHostKeyChecking=no" not in argv


# -- teardown -------------------------------------------------------------------------------------------------------

def test_stop_leaves_no_sshd_link_namespace_or_files(tmp_path: pathlib.Path) -> None:
    require_remote_prerequisites()
    access = RemoteAccess(LibvirtHost("tr-remote-stop", "192.168.141.0/24", log_dir=tmp_path / "logs"),
                          link_index=141)
    access.start()
    try:
        sshd = access.sshd_pid
        assert sshd is not None and process_alive(sshd)
        lists_the_pool(access.ssh_uri(), access)
    finally:
        access.stop()
    assert not process_alive(sshd)
    links = subprocess.run(["ip", "-brief", "link"], capture_output=True, text=True, check=True).stdout
    assert access.root_link not in links
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert access.host.netns not in netns
    assert not access.folder.exists() and not access.host.state_dir.exists()
    assert (tmp_path / "logs" / "sshd.log").exists()  # logs stay where they were asked to
    access.stop()  # a second stop is harmless
    assert os.path.isdir("/run/sshd")


# -- A connection's death, as the provider learns it -------------------------------------------------------------

async def test_a_connection_whose_peer_stops_answering_is_no_longer_live_without_a_call_on_it(
        remote: RemoteAccess) -> None:
    """hypervisor.connection's `connected` follows libvirt's close callback: libvirtd stopped (SIGSTOP) longer than the
    keepalive allows (a ping after 5 s of silence, three unanswered: 20 s), the provider's connection over qemu+tls
    is known dead with no call made on it; libvirtd running again, the next call opens a new one."""
    from capi_libvirt.hypervisor import credentials
    from capi_libvirt.hypervisor import host as host_api
    folder = remote.client_dir
    secret = credentials.Credentials({"ca.crt": (folder / "cacert.pem").read_bytes(),
                                      "tls.crt": (folder / "clientcert.pem").read_bytes(),
                                      "tls.key": (folder / "clientkey.pem").read_bytes()})
    host = host_api.libvirt_host("tr-remote", f"qemu+tls://{remote.address}/system", secret, None)
    try:
        await host.probe(remote.host.pool_name, None, [], False)
        assert host.connected and host.opened == 1
        pid = remote.host.libvirtd_pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            for _ in range(80):  # 40 s at most
                if not host.connected:
                    break
                await asyncio.sleep(0.5)
            dead_after = time.monotonic() - stopped
        finally:
            os.kill(pid, signal.SIGCONT)
        assert not host.connected, "still live 40 s after its peer stopped answering"
        assert dead_after >= 15, f"dead after {dead_after:.0f} s: before the keepalive could have ended it"
        await host.probe(remote.host.pool_name, None, [], False)
        assert host.connected and host.opened == 2
    finally:
        await asyncio.get_running_loop().run_in_executor(None, host.close)
