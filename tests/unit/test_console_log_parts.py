"""`capi-libvirt console-log`, its pure parts: which bytes of a log to read, where a machine's log is, how its host is
reached (a `--host` URI, or the LibvirtHost and its credentials Secret), and the errors the user reads."""

from __future__ import annotations

import io

import libvirt
import pytest

from capi_libvirt import cli, console_log
from capi_libvirt.core import naming
from capi_libvirt.hypervisor import machines, serial_log
from capi_libvirt.kube.client import ApiError

pytestmark = pytest.mark.unit

UID = "0f4e6f3e-2d55-4c8b-9a51-6f1b0c0de001"


@pytest.mark.parametrize(("size", "start", "tail", "expected"), [
    (100, 0, None, (0, 100)),  # the whole log
    (100, 0, 30, (70, 30)),  # its last 30 bytes
    (100, 0, 500, (0, 100)),  # a tail longer than the log: all of it
    (100, 100, None, (100, 0)),  # a follower that has read everything
    (150, 100, None, (100, 50)),  # ... reads only what was added
    (150, 100, 10, (140, 10)),  # ... at most the tail of it
    (40, 100, None, (0, 40)),  # the log is shorter than what was read: truncated or rotated, read it afresh
    (0, 0, None, (0, 0)),  # an empty log
])
def test_log_range_reads_from_the_follower_offset_at_most_the_tail(size, start, tail, expected):
    assert serial_log.log_range(size, start, tail) == expected


def test_machine_reference_is_namespace_slash_name_or_a_name_in_the_namespace_given():
    assert console_log.parse_machine_ref("team-a/worker-1") == ("team-a", "worker-1")
    assert console_log.parse_machine_ref("team-a/worker-1", "other") == ("team-a", "worker-1")
    assert console_log.parse_machine_ref("worker-1", "team-a") == ("team-a", "worker-1")
    for bad in ("worker-1", "/worker-1", "team-a/", "a/b/c", ""):
        with pytest.raises(ValueError, match="NAMESPACE/NAME"):
            console_log.parse_machine_ref(bad)


LOG = b"one\ntwo\nthree\n"


@pytest.mark.parametrize(("data", "lines", "whole", "expected"), [
    (LOG, 1, True, b"three\n"),
    (LOG, 2, False, b"two\nthree\n"),  # enough lines read: the beginning need not be there
    (LOG, 3, True, LOG),
    (LOG, 3, False, None),  # the first of them may begin before what was read: read more
    (LOG, 10, True, LOG),  # fewer lines than asked in the whole log: all of it
    (b"one\ntwo", 1, True, b"two"),  # a last line still being written counts, as in kubectl logs
    (b"one\ntwo", 2, True, b"one\ntwo"),
    (LOG, 0, False, b""),
    (b"", 5, True, b""),
])
def test_the_last_lines_of_a_log(data, lines, whole, expected):
    assert console_log.last_lines(data, lines, whole) == expected


def test_limited_output_stops_at_the_limit():
    out = io.BytesIO()
    limited = console_log.Limited(out, 5)
    limited.write(b"abc")
    assert not limited.full
    limited.write(b"defg")
    limited.write(b"more")
    assert (out.getvalue(), limited.full) == (b"abcde", True)
    unlimited = console_log.Limited(io.BytesIO(), None)
    unlimited.write(b"x" * 1000)
    assert not unlimited.full


def test_the_command_line_takes_kubectl_logs_flags():
    args = cli.parser().parse_args(["console-log", "-n", "ns", "m", "--tail", "20", "--limit-bytes", "4096", "-f",
                                    "--kubeconfig", "/k", "--context", "admin@mgmt", "--host", "kvm1=qemu:///system"])
    assert (args.namespace, args.machine, args.tail, args.limit_bytes, args.follow, args.kubeconfig, args.context,
            args.host) == ("ns", "m", 20, 4096, True, "/k", "admin@mgmt", ["kvm1=qemu:///system"])
    defaults = cli.parser().parse_args(["console-log", "ns/m"])
    assert (defaults.namespace, defaults.tail, defaults.limit_bytes, defaults.follow, defaults.host) == \
        (None, None, None, False, [])
    assert cli.parser().parse_args(["console-log", "m", "--tail", "0"]).tail == 0  # as kubectl: nothing, then -f
    for bad in (["console-log", "ns/m", "--tail", "-1"], ["console-log", "ns/m", "--tail", "x"],
                ["console-log", "ns/m", "--limit-bytes", "0"]):
        with pytest.raises(SystemExit):
            cli.parser().parse_args(bad)


class FakeKube:
    """The three reads console-log makes, from dictionaries; `refuse` names reads that answer 403."""

    def __init__(self, machines_: dict | None = None, hosts: dict | None = None, secrets: dict | None = None,
                 refuse: tuple[str, ...] = ()) -> None:
        self.machines, self.hosts, self.secrets, self.refuse = machines_ or {}, hosts or {}, secrets or {}, refuse

    def _check(self, what: str) -> None:
        if what in self.refuse:
            raise ApiError(403, "Forbidden")

    async def get_libvirt_machine(self, namespace: str, name: str) -> dict | None:
        self._check("machine")
        return self.machines.get((namespace, name))

    async def get_libvirt_host(self, name: str) -> dict | None:
        self._check("host")
        return self.hosts.get(name)

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        self._check("secret")
        return self.secrets.get((namespace, name))


def machine(spec: dict | None = None, status: dict | None = None) -> dict:
    return {"metadata": {"namespace": "ns", "name": "m", "uid": UID}, "spec": spec or {"image": {"volume": "b"}},
            "status": status or {}}


async def test_the_log_is_located_from_the_status_host_the_spec_pool_and_the_uid():
    kube = FakeKube({("ns", "m"): machine({"storagePool": "fast"}, {"host": "kvm1"})})
    assert await console_log.locate(kube, "ns", "m") == console_log.SerialLog(
        host="kvm1", pool="fast", volume=naming.serial_log_file_name("ns", "m", UID))
    kube = FakeKube({("ns", "m"): machine(status={"host": "kvm1"})})
    assert (await console_log.locate(kube, "ns", "m")).pool == "default"  # the spec's default pool


async def test_a_missing_machine_is_named():
    with pytest.raises(console_log.ConsoleLogError, match="^LibvirtMachine ns/gone not found$"):
        await console_log.locate(FakeKube(), "ns", "gone")


async def test_a_machine_not_placed_yet_says_what_it_waits_for():
    waiting = {"conditions": [{"type": "Provisioned", "status": "False", "reason": "InsufficientCapacity",
                               "message": "kvm1: 2 CPUs free, 4 asked"}]}
    kube = FakeKube({("ns", "m"): machine(status=waiting)})
    with pytest.raises(console_log.ConsoleLogError) as raised:
        await console_log.locate(kube, "ns", "m")
    assert str(raised.value) == \
        "LibvirtMachine ns/m is not placed on a host yet (InsufficientCapacity: kvm1: 2 CPUs free, 4 asked)"
    assert console_log.not_placed_message(machine()) == "LibvirtMachine ns/m is not placed on a host yet"


async def test_a_machine_whose_console_is_not_logged_says_so():
    kube = FakeKube({("ns", "m"): machine({"serialLog": False}, {"host": "kvm1"})})
    with pytest.raises(console_log.ConsoleLogError, match="serialLog: false"):
        await console_log.locate(kube, "ns", "m")


async def test_a_refused_read_names_what_was_read():
    with pytest.raises(console_log.ConsoleLogError, match="^cannot read LibvirtMachine ns/m: 403 Forbidden$"):
        await console_log.locate(FakeKube(refuse=("machine",)), "ns", "m")


SSH_DATA = {"ssh-privatekey": b"-----BEGIN OPENSSH PRIVATE KEY-----\nsecret-key\n",
            "known_hosts": b"kvm1 ssh-ed25519 A"}


def libvirt_host(uri: str, secret: bool = True) -> dict:
    ref = {"credentialsSecretRef": {"namespace": "sys", "name": "kvm1-ssh"}} if secret else {}
    return {"spec": {"uri": uri, **ref}}


async def test_a_host_is_reached_through_its_libvirthost_and_credentials_secret():
    kube = FakeKube(hosts={"kvm1": libvirt_host("qemu+ssh://capi@kvm1/system")},
                    secrets={("sys", "kvm1-ssh"): SSH_DATA})
    uri, secret = await console_log.host_access(kube, "kvm1", {})
    assert uri == "qemu+ssh://capi@kvm1/system" and secret is not None and dict(secret.data) == SSH_DATA
    assert "secret-key" not in repr(secret)


async def test_a_host_given_on_the_command_line_needs_no_object():
    kube = FakeKube(refuse=("host", "secret"))  # never asked
    assert await console_log.host_access(kube, "kvm1", {"kvm1": "qemu:///system"}) == ("qemu:///system", None)
    kube = FakeKube(hosts={"local": libvirt_host("qemu:///system", secret=False)})
    assert await console_log.host_access(kube, "local", {}) == ("qemu:///system", None)


async def test_host_problems_are_one_clear_line_without_credentials():
    cases = [
        (FakeKube(), "^LibvirtHost kvm1 not found \\(for a host without an object, pass --host kvm1=URI\\)$"),
        (FakeKube(hosts={"kvm1": libvirt_host("qemu+ssh://capi@kvm1/system")}),
         "^credentials Secret sys/kvm1-ssh of LibvirtHost kvm1 not found$"),
        (FakeKube(hosts={"kvm1": libvirt_host("http://kvm1")}), "^LibvirtHost kvm1 has an invalid spec: uri$"),
        (FakeKube(hosts={"kvm1": libvirt_host("qemu+ssh://capi@kvm1/system")}, refuse=("secret",)),
         "^cannot read the credentials Secret sys/kvm1-ssh of LibvirtHost kvm1: 403 Forbidden$"),
    ]
    for kube, message in cases:
        with pytest.raises(console_log.ConsoleLogError, match=message):
            await console_log.host_access(kube, "kvm1", {})


def libvirt_error(code: int, domain: int) -> libvirt.libvirtError:
    error = libvirt.libvirtError("refused")
    error.err = (code, domain, "refused", 2, None, None, None, -1, -1)  # what libvirt fills in from virGetLastError
    return error


class FakePool:
    def __init__(self, refusals: list[libvirt.libvirtError]) -> None:
        self.refusals, self.refreshes = refusals, 0

    def isActive(self) -> bool:  # noqa: N802  libvirt's names
        return True

    def refresh(self, flags: int) -> None:
        self.refreshes += 1
        if self.refusals:
            raise self.refusals.pop(0)


class FakeConnection:
    def __init__(self, pool: FakePool) -> None:
        self.pool = pool

    def storagePoolLookupByName(self, name: str) -> FakePool:  # noqa: N802
        return self.pool


def test_a_pool_refresh_waits_out_a_running_upload_and_nothing_else(monkeypatch):
    monkeypatch.setattr(machines, "REFRESH_RETRY_S", 0.0)
    busy = libvirt_error(libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_FROM_STORAGE)  # "asynchronous jobs running"
    pool = FakePool([busy, busy])
    assert machines._refreshed_pool(FakeConnection(pool), "default") is pool and pool.refreshes == 3

    other = libvirt_error(libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_STORAGE)  # a disk problem: no use waiting
    pool = FakePool([other, busy])
    with pytest.raises(libvirt.libvirtError):
        machines._refreshed_pool(FakeConnection(pool), "default")
    assert pool.refreshes == 1

    monkeypatch.setattr(machines, "REFRESH_WAIT_S", 0.0)  # an upload that never ends: given up on, not waited forever
    pool = FakePool([busy] * 1000)
    with pytest.raises(libvirt.libvirtError):
        machines._refreshed_pool(FakeConnection(pool), "default")
    assert pool.refreshes == 1
