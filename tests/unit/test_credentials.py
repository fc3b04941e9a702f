"""Transport credentials: on disk only inside the block, private, verification never switched off by the URI."""

from __future__ import annotations

import os
import pathlib
import stat
import urllib.parse

import pytest

from capi_libvirt.hypervisor import credentials
from capi_libvirt.hypervisor.credentials import Credentials, CredentialsError, materialized

pytestmark = pytest.mark.unit

SSH = Credentials({"ssh-privatekey": b"-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n", "known_hosts": b"h ssh-ed25519 AAA"})
TLS = Credentials({"ca.crt": b"ca", "tls.crt": b"cert", "tls.key": b"-----BEGIN PRIVATE KEY-----\nsecret\n"})


def query(uri: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(uri).query))


def test_ssh_files_are_private_and_gone_after_the_block():
    with materialized("qemu+ssh://root@kvm1/system", SSH) as uri:
        params = query(uri)
        folder = pathlib.Path(params["keyfile"]).parent
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(pathlib.Path(params["keyfile"]).stat().st_mode) == 0o600
        assert pathlib.Path(params["keyfile"]).read_bytes() == SSH.data["ssh-privatekey"]
        assert params["command"] == str(folder / "ssh") and os.access(params["command"], os.X_OK)
        assert params["no_verify"] == "0" and params["no_tty"] == "1"
        assert uri.startswith("qemu+ssh://root@kvm1/system?")
    assert not folder.exists()


def test_files_are_gone_when_the_connection_fails_inside_the_block():
    with pytest.raises(RuntimeError):
        with materialized("qemu+tls://kvm2/system", TLS) as uri:
            folder = pathlib.Path(query(uri)["pkipath"])
            assert sorted(p.name for p in folder.iterdir()) == ["cacert.pem", "clientcert.pem", "clientkey.pem"]
            raise RuntimeError("connect failed")
    assert not folder.exists()


def test_libssh_checks_known_hosts_itself():
    with materialized("qemu+libssh://root@kvm1/system", SSH) as uri:
        params = query(uri)
        assert params["known_hosts_verify"] == "normal" and "command" not in params


@pytest.mark.parametrize("uri", [
    "qemu+tls://kvm2/system?no_verify=1",
    "qemu+tls://kvm2/system?NO_VERIFY=1",  # libvirt compares parameter names case-insensitively
    "qemu+ssh://root@kvm1/system?command=/bin/sh",
    "qemu+libssh://root@kvm1/system?known_hosts_verify=ignore",
    "qemu+ext:///system?command=/bin/sh",
    "qemu+tcp://kvm1/system",
    "xen+ssh://kvm1/system",
])
def test_uris_that_could_switch_verification_off_or_run_programs_are_refused(uri):
    with pytest.raises(CredentialsError):
        with materialized(uri, SSH):
            pass


def test_remote_transports_need_credentials_and_the_right_keys():
    with pytest.raises(CredentialsError, match="credentialsSecretRef"):
        with materialized("qemu+ssh://root@kvm1/system", None):
            pass
    with pytest.raises(CredentialsError, match="known_hosts"):
        with materialized("qemu+ssh://root@kvm1/system", Credentials({"ssh-privatekey": b"k"})):
            pass


def test_local_uris_pass_unchanged_and_the_repr_hides_values():
    local = "qemu+unix:///system?socket=/run/x/libvirt-sock"
    with materialized(local, None) as uri:
        assert uri == local
    assert "secret" not in repr(SSH) and "ssh-privatekey" in repr(SSH)
    assert credentials.check_uri("qemu:///system") == "unix"


def test_the_sweep_at_start_leaves_a_live_operators_folder_and_removes_a_dead_ones(tmp_path, monkeypatch):
    """Two operators may share /tmp (pytest workers, two out-of-cluster runs): CI once saw one's start remove the
    ssh wrapper the other was connecting with ("cannot execute binary .../ssh: No such file or directory")."""
    import subprocess
    monkeypatch.setattr(credentials.tempfile, "tempdir", str(tmp_path))
    live = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        folders = {
            "live": tmp_path / f"capi-libvirt-cred-{live.pid}-abc",
            "dead": tmp_path / f"capi-libvirt-cred-{dead.pid}-abc",
            "ours": tmp_path / f"capi-libvirt-cred-{os.getpid()}-abc",  # an earlier life of this pid
            "old-style": tmp_path / "capi-libvirt-cred-k2j4h5",  # named before folders carried a pid
            "not-a-pid": tmp_path / "capi-libvirt-cred-\u00b2-abc",  # str.isdigit() is true of "²", int() fails
        }
        for folder in folders.values():
            folder.mkdir()
            (folder / "id").write_bytes(b"key")
        (tmp_path / "unrelated").mkdir()
        credentials.sweep_leftovers()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([folders["live"].name, "unrelated"])
    finally:
        live.kill()
        live.wait()
    with materialized("qemu+ssh://root@kvm1/system", SSH) as uri:
        folder = pathlib.Path(query(uri)["keyfile"]).parent
        assert folder.name.startswith(f"capi-libvirt-cred-{os.getpid()}-") and folder.parent == tmp_path
        credentials.sweep_leftovers()  # a second operator started in this process (the tests run several)
        assert folder.exists() and os.access(query(uri)["command"], os.X_OK)
    assert not folder.exists()
