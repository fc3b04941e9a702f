"""A sampled subset of hostile input through the real LibvirtMachine reconcile, against the real API server and a real
libvirtd of its own (host `pytest-hostile`, 192.168.175.0/24).

Each case (a spec admission accepts but made to hurt: names and labels at their limits, metacharacters and unicode in
the kernel path and command line, odd MACs, static addresses, machine types, CPU modes, buses, sizes, missing networks
and bridges; bootstrap Secrets that are binary, gzip, at the Secret size limit, empty, without `value`, with unknown,
non-UTF-8 or extra keys; preset providerIDs) is created the way Cluster API does, reconciled pass by pass as the
operator's worker would, then deleted. Every case must:

- end in a clear Provisioned condition: a known reason, never ReconcileError (an unexpected exception), a message
  that names the problem, a Warning event for a failure, and no bootstrap data in any condition or event;
- not crash-loop: a failing pass backs off (at least BACKOFF_FIRST, never shorter than the pass before) or waits for a
  watch event (None); a permanent error does not come back sooner;
- when a domain was defined, be one libvirt accepted and virt-xml-validate passes, its owner metadata this machine's;
- after the delete, leave nothing on the host: no domain, no volume but the base image.

The domains need not boot: the base image is an empty qcow2, so a running domain waits for an address forever.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import gzip
import logging
import pathlib
import shutil
import subprocess
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client, config

from capi_libvirt.api import meta, reasons
from capi_libvirt.core import conditions, domain_owner, naming
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.kube import api, kubeconfig
from capi_libvirt.kube.client import KubeClient
from capi_libvirt.reconcile import inventory
from capi_libvirt.reconcile import machine as reconcile
from devenv import capi_objects
from devenv import control_plane as cp
from devenv.libvirt_host import LibvirtHost

from fixtures_control_plane import OPERATOR_USER, allow_secrets
from fixtures_libvirt import require_libvirt_host_prerequisites
from hostile_inputs import (
    COUNTS,
    IPV4,
    IPV6,
    PIECES,
    SECRET_LIMIT,
    blob,
    dns_subdomain,
    hexbyte,
    label_key,
    label_value,
)
from prereq import require

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
T = TypeVar("T")
log = logging.getLogger(__name__)

BASE = "hostile-base.qcow2"
SECRET_MARK = b"s3cr3t-hostile-bootstrap"
CLUSTER = "hostile"
# Every reason a pass may end in. ReconcileError (an exception nobody expected) is not among them.
KNOWN_REASONS = {
    reasons.WAITING_FOR_ADDRESS, reasons.PROVISIONED_REASON, reasons.IMAGE_NOT_FOUND,
    reasons.BOOTSTRAP_FORMAT_UNSUPPORTED, reasons.BOOTSTRAP_DATA_MISSING,
    reasons.WAITING_FOR_BOOTSTRAP_DATA, reasons.HOST_UNREACHABLE, "HypervisorError",
    reasons.NETWORK_NOT_FOUND, reasons.ADOPTION_REFUSED, reasons.INVALID_SPEC, "InsufficientCapacity",
    "HostNotFound", reasons.TENANT_NOT_ALLOWED, reasons.SECRETS_FORBIDDEN, reasons.MACHINE_TYPE_NOT_SUPPORTED,
    reasons.ADDRESS_CONFLICT,
}
KERNEL_TEXT = [p for p in PIECES if not any(c < " " or c in "\x7f\x85\ufffe\uffff" for c in p)]


def hostile(examples: int) -> settings:
    """Without shrinking: each example costs a real machine's life on libvirtd, and the failing one is printed as is."""
    return settings(settings.get_profile("hostile"), max_examples=examples,
                    phases=(Phase.explicit, Phase.generate))


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """A coroutine on an event loop of its own, in a thread of its own: Hypothesis drives a plain function."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


# -- the test bed ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LibvirtHost]:
    """A libvirt host of this module's own, with an empty 16 MiB qcow2 as the base image every overlay sits on."""
    require_libvirt_host_prerequisites()
    require(shutil.which("virt-xml-validate") is not None, "virt-xml-validate (apt: libvirt-clients)")
    with LibvirtHost("pytest-hostile", "192.168.175.0/24", log_dir=tmp_path_factory.mktemp("hostile-host")) as host:
        with host.connect() as conn:
            conn.storagePoolLookupByName(host.pool_name).createXML(
                f"<volume><name>{BASE}</name><capacity unit='MiB'>16</capacity>"
                "<target><format type='qcow2'/></target></volume>", 0)
        yield host


@pytest.fixture(scope="module")
def hostile_namespace(control_plane: cp.LocalControlPlane) -> Iterator[str]:
    name = f"hostile-{uuid.uuid4().hex[:6]}"
    control_plane.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": name}})
    allow_secrets(control_plane, name)  # the RoleBinding a user makes for each namespace the provider serves
    run(with_admin(control_plane, lambda admin: capi_objects.create_cluster(admin, name, CLUSTER)))
    yield name
    control_plane.request("DELETE", f"/api/v1/namespaces/{name}")


async def with_admin(plane: cp.LocalControlPlane, action: Any) -> Any:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(plane.kubeconfig_path), client_configuration=configuration)
    async with client.ApiClient(configuration) as admin:
        return await action(admin)


class Errors(logging.Handler):
    """The reconcile's ERROR records (log.exception of an unexpected failure)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def reconcile_errors() -> Iterator[Errors]:
    handler = Errors()
    logger = logging.getLogger(reconcile.__name__)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


# -- one case -------------------------------------------------------------------------------------------------------
class Case:
    def __init__(self, plane: cp.LocalControlPlane, host: LibvirtHost, namespace: str, tmp: pathlib.Path) -> None:
        self.plane, self.host, self.namespace, self.tmp = plane, host, namespace, tmp
        self.events: list[tuple[str, str, str]] = []

    async def run(self, name: str, labels: dict[str, str], spec: dict[str, Any], secret: dict[str, bytes] | None,
                  expect: set[str] | None = None) -> str:
        """Create, reconcile until the outcome holds still, check it, delete, check the host; the final reason."""
        operator_credentials = kubeconfig.from_kubeconfig(paths=[self.plane.kubeconfig_for(OPERATOR_USER)])
        admin_configuration = client.Configuration()
        await config.load_kube_config(config_file=str(self.plane.kubeconfig_path),
                                      client_configuration=admin_configuration)
        registry = host_api.HostRegistry({self.host.name: self.host.uri})
        async with KubeClient(operator_credentials) as operator_client, \
                client.ApiClient(admin_configuration) as admin:
            deps = reconcile.Dependencies(kube=api.KubeAPI(operator_client), inventory=inventory.Inventory(registry),
                                          post_event=lambda body, kind, reason, message:
                                          self.events.append((kind, reason, message)))
            try:
                await self.create(admin, name, labels, spec, secret)
                reason = await self.reconcile_until_still(deps, name)
                if expect is not None:
                    assert reason in expect, (reason, self.events)
                uid = (await deps.kube.reread_libvirt_machine(self.namespace, name))["metadata"]["uid"]
                self.check_domain(name, uid)
                await self.delete(admin, deps, name)
            finally:
                await asyncio.get_running_loop().run_in_executor(None, registry.close)
        self.check_host_clean()
        return reason

    async def create(self, admin: client.ApiClient, name: str, labels: dict[str, str], spec: dict[str, Any],
                     secret: dict[str, bytes] | None) -> None:
        objects = client.CustomObjectsApi(admin)
        secret_name = f"bootstrap-{uuid.uuid4().hex[:8]}"
        if secret is not None:
            await client.CoreV1Api(admin).create_namespaced_secret(self.namespace, client.V1Secret(
                metadata=client.V1ObjectMeta(name=secret_name, labels={meta.CLUSTER_NAME_LABEL: CLUSTER}),
                type="cluster.x-k8s.io/secret", data={k: base64.b64encode(v).decode() for k, v in secret.items()}))
        labels = {**labels, meta.CLUSTER_NAME_LABEL: CLUSTER}
        owner = await objects.create_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, self.namespace,
                                                              "machines", {
            "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Machine",
            "metadata": {"name": name, "labels": labels},
            "spec": {"clusterName": CLUSTER, "bootstrap": {"dataSecretName": secret_name},
                     "infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtMachine", "name": name}}})
        await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, self.namespace, "libvirtmachines", {
            "apiVersion": meta.API_VERSION, "kind": "LibvirtMachine",
            "metadata": {"name": name, "labels": labels, "ownerReferences": [{
                "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Machine", "name": name,
                "uid": owner["metadata"]["uid"], "controller": True}]},
            "spec": spec})

    async def reconcile_until_still(self, deps: reconcile.Dependencies, name: str, passes: int = 5) -> str:
        """Passes as the worker runs them (the object re-read as a watch would bring it), until the outcome holds:
        no retry asked, the same failure twice, or the domain running and waiting for its address."""
        previous: tuple[str, float | None] | None = None
        for _ in range(passes):
            await deps.kube.reread_libvirt_machine(self.namespace, name)
            delay = await reconcile.reconcile(deps, self.namespace, name)
            body = await deps.kube.reread_libvirt_machine(self.namespace, name)
            provisioned = conditions.get_condition(body["status"]["conditions"], conditions.PROVISIONED)
            assert provisioned is not None, body["status"]
            reason = provisioned["reason"]
            assert reason in KNOWN_REASONS, (reason, provisioned["message"])
            failing = reason not in (reasons.WAITING_FOR_ADDRESS, reasons.PROVISIONED_REASON)
            if failing:
                assert provisioned["message"] and provisioned["status"] == "False", provisioned
                # no crash loop: a failure waits for a watch event, or backs off, never sooner than before
                assert delay is None or delay >= reconcile.BACKOFF_FIRST, (reason, delay)
                if previous is not None and previous[0] == reason and previous[1] is not None:
                    assert delay is None or delay >= previous[1], (reason, previous, delay)
                # waiting (for data, for capacity) is no failure: a Normal event; a failure is a Warning
                kind = "Normal" if reason.startswith("Waiting") or reason == "InsufficientCapacity" else "Warning"
                assert (kind, reason) in {(kind, why) for kind, why, _ in self.events}, self.events
            if delay is None or not failing or (previous is not None and previous[0] == reason):
                log.info("%s: %s %r (next pass in %s s)", name[:40], reason, provisioned["message"], delay)
                self.check_no_bootstrap_data_in(body)
                return str(reason)
            previous = (reason, delay)
        raise AssertionError(f"no steady outcome after {passes} passes: {self.events}")

    def check_no_bootstrap_data_in(self, body: dict[str, Any]) -> None:
        shown = str(body.get("status")) + str(self.events)
        assert SECRET_MARK.decode() not in shown

    def check_domain(self, name: str, uid: str) -> None:
        """A defined domain is one libvirt took and its schema accepts, owned by this machine."""
        with self.host.connect() as conn:
            domains = [d for d in conn.listAllDomains() if d.UUIDString() == naming.domain_uuid(uid)]
            if not domains:
                return
            xml = domains[0].XMLDesc(0)
        COUNTS["reconcile: domains defined on libvirtd"] += 1
        assert domain_owner.parse_owner(xml) == domain_owner.Owner(self.namespace, name, uid, CLUSTER)
        path = self.tmp / f"{naming.domain_uuid(uid)}.xml"
        path.write_text(xml)
        result = subprocess.run(["virt-xml-validate", str(path), "domain"], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr

    async def delete(self, admin: client.ApiClient, deps: reconcile.Dependencies, name: str) -> None:
        objects = client.CustomObjectsApi(admin)
        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, self.namespace, "libvirtmachines", name)
        for _ in range(3):
            if await deps.kube.reread_libvirt_machine(self.namespace, name) is None:
                break
            await reconcile.reconcile(deps, self.namespace, name)
        assert await deps.kube.reread_libvirt_machine(self.namespace, name) is None, "finalizer never released"
        await objects.delete_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, self.namespace, "machines",
                                                      name)

    def check_host_clean(self) -> None:
        with self.host.connect() as conn:
            assert [d.name() for d in conn.listAllDomains()] == []
            pool = conn.storagePoolLookupByName(self.host.pool_name)
            pool.refresh(0)
            assert pool.listVolumes() == [BASE]
        nvram = self.host.state_dir / "lib" / "qemu" / "nvram"  # UEFI variable stores, removed with their domains
        assert not nvram.is_dir() or list(nvram.iterdir()) == []


@pytest.fixture
def case(control_plane, hostile_host, hostile_namespace, reconcile_errors, tmp_path) -> Iterator[Any]:
    def one(*args: Any, **kwargs: Any) -> str:
        COUNTS["reconcile: cases on libvirtd"] += 1
        reason = run(Case(control_plane, hostile_host, hostile_namespace, tmp_path).run(*args, **kwargs))
        assert reconcile_errors.records == [], [r.getMessage() for r in reconcile_errors.records]
        COUNTS[f"reconcile: ended in {reason}"] += 1
        return reason
    yield one


# -- strategies of this tier: admissible, aimed at the host -------------------------------------------------------
def unicast_mac() -> st.SearchStrategy[str]:
    return st.one_of(st.lists(hexbyte(), min_size=5, max_size=5).map(lambda rest: ":".join(["52", *rest])),
                     st.sampled_from(["00:00:00:00:00:00", "fe:ff:ff:ff:ff:ff", "52:54:00:AB:CD:EF", "02:00:00:00:00:01"]))


def hostile_path() -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(KERNEL_TEXT), min_size=1, max_size=12).map(lambda parts: "/" + "".join(parts))


@st.composite
def reconcile_spec(draw: st.DrawFn, network: str, pool: str) -> dict[str, Any]:
    interface = st.one_of(
        st.fixed_dictionaries({"network": st.just(network)}, optional={
            "macAddress": unicast_mac(), "model": st.sampled_from(["virtio", "e1000", "rtl8139"]),
            "static": st.fixed_dictionaries({"addresses": st.lists(
                st.one_of(IPV4.map(lambda a: a + "/24"), IPV6.map(lambda a: a + "/64")), min_size=1, max_size=8)},
                optional={"gateway": IPV4 | IPV6, "nameservers": st.lists(IPV4 | IPV6, max_size=3)}).filter(
                lambda s: not any("::ffff:" in a for a in [*s["addresses"], s.get("gateway", "")]))}),
    )
    broken_interface = st.one_of(
        st.fixed_dictionaries({"network": st.sampled_from(["missing-net", "n" * 255])}),
        st.fixed_dictionaries({"bridge": st.sampled_from(["br-nope", "b" * 15])}),
    )
    spec: dict[str, Any] = {
        "image": {"volume": BASE}, "storagePool": pool, "domainType": "qemu",
        "memoryMiB": draw(st.sampled_from([128] * 5 + [192, 256, 16 * 1024 * 1024])),  # 16 TiB: no host takes it
        "cpus": draw(st.sampled_from([1] * 5 + [2, 3, 512])),
        "diskGiB": draw(st.sampled_from([1, 20, 65536])),
        "machineType": draw(st.sampled_from(["q35", "pc"] * 3 + ["x" * 64])),  # unknown to QEMU: refused by name
        "diskBus": draw(st.sampled_from(["virtio", "scsi", "sata"])),
        "guestAgent": draw(st.booleans()), "serialLog": draw(st.booleans()),
        "interfaces": draw(st.lists(interface, min_size=1, max_size=3)),
    }
    if draw(st.integers(0, 2)) == 0:  # a missing network or bridge somewhere
        spec["interfaces"].append(draw(broken_interface))
    if draw(st.integers(0, 3)) == 0:
        spec["cpuMode"] = draw(st.sampled_from(["maximum", "host-model"]))  # host-passthrough: refused at admission
    if draw(st.integers(0, 3)) == 0:
        spec["firmware"] = "uefi"  # OVMF and a variable store of the domain's own, which teardown must remove
    if draw(st.integers(0, 2)) == 0:
        spec["dataDisks"] = draw(st.lists(st.fixed_dictionaries({"sizeGiB": st.sampled_from([1, 65536])}, optional={
            "bus": st.sampled_from(["virtio", "scsi", "sata"])}), min_size=1, max_size=3))
    if draw(st.integers(0, 3)) == 0:
        spec["cpuTopology"] = {"sockets": 1, "cores": spec["cpus"], "threads": 1}
    if draw(st.integers(0, 3)) == 0:
        spec["kernelBoot"] = {"kernel": draw(hostile_path()), "initrd": draw(hostile_path()),
                              "cmdline": draw(st.lists(st.sampled_from(KERNEL_TEXT), max_size=30).map("".join))}
    return spec


def cloud_config(kind: str, size: int) -> bytes:
    """User data with the secret marker inside (gzip: inside the compressed text, as a real bootstrap would be)."""
    if kind == "gzip":
        return gzip.compress(b"#cloud-config\n# " + SECRET_MARK + b"\n" + blob(size, 1, "text"), mtime=0)
    return SECRET_MARK + blob(size, 7, kind)


NAMES = st.one_of(dns_subdomain(253).filter(lambda n: len(n) <= 253), st.just("m" * 63), st.just("a." * 126 + "z"))
LABELS = st.dictionaries(label_key(), label_value(), max_size=3).filter(
    lambda labels: all(k.count("/") <= 1 and len(k.rpartition("/")[2]) <= 63 and len(v) <= 63 and
                       all(c.isascii() and (c.isalnum() or c in "-_./") for c in k + v) and
                       (not v or (v[0].isalnum() and v[-1].isalnum())) and k[:1].isalnum() and k[-1:].isalnum() and
                       len(k.rpartition("/")[0]) <= 253 and not k.startswith(("kubernetes.io", "k8s.io"))
                       for k, v in labels.items()))


def unique(name: str) -> str:
    """A case's object name: the drawn one, kept unique (and within 253) by a short tail."""
    tail = uuid.uuid4().hex[:5]
    return (name[: 253 - len(tail) - 1].rstrip(".-") + "-" + tail) if len(name) > 5 else f"{name}-{tail}"


# -- the tests ------------------------------------------------------------------------------------------------------
def test_hostile_specs_end_in_a_clear_condition_and_leave_nothing(case, hostile_host):
    @hostile(14)
    @given(NAMES, LABELS, reconcile_spec(hostile_host.network_name, hostile_host.pool_name))
    @example("m" * 253, {"a" * 253 + "/" + "n" * 63: "v" * 63},
             {"image": {"volume": BASE}, "storagePool": hostile_host.pool_name, "domainType": "qemu", "memoryMiB": 128,
              "cpus": 1, "interfaces": [{"network": hostile_host.network_name, "macAddress": "00:00:00:00:00:00"}],
              "kernelBoot": {"kernel": "/<x>&'\"$(reboot)`id`;ü名🚀", "cmdline": "]]><!-- & $(rm -rf /) \u202e"}})
    def one(name: str, labels: dict[str, str], spec: dict[str, Any]) -> None:
        case(unique(name), labels, spec, {"value": cloud_config("text", 256), "format": b"cloud-config"})

    before = COUNTS["reconcile: cases on libvirtd"]
    one()
    assert COUNTS["reconcile: cases on libvirtd"] - before >= 15


SECRETS = st.one_of(
    st.builds(lambda kind, size: {"value": cloud_config(kind, size), "format": b"cloud-config"},
              st.sampled_from(["binary", "gzip", "text", "nul"]), st.integers(0, 4096)),
    st.builds(lambda value, fmt: {"value": value, "format": fmt},
              st.just(SECRET_MARK), st.sampled_from([b"ignition", b"\xff\xfe\x00", b"", b"CLOUD-CONFIG", "é".encode()])),
    st.builds(lambda extra: {"value": SECRET_MARK, "format": b"cloud-config", **extra},
              st.dictionaries(st.sampled_from(["extra", "a" * 253, "v-._1"]), st.binary(max_size=64), min_size=1)),
)
SECRET_EXPECTATIONS = {  # what the condition says, by the data's shape
    "ok": {reasons.WAITING_FOR_ADDRESS},
    "format": {reasons.BOOTSTRAP_FORMAT_UNSUPPORTED},
    "missing": {reasons.BOOTSTRAP_DATA_MISSING},
    "no-secret": {reasons.WAITING_FOR_BOOTSTRAP_DATA},
}


def expectation(secret: dict[str, bytes] | None) -> set[str]:
    if secret is None:
        return SECRET_EXPECTATIONS["no-secret"]
    if secret.get("format", b"cloud-config") not in (b"cloud-config", b"ignition"):  # ignition: through fw_cfg
        return SECRET_EXPECTATIONS["format"]
    return SECRET_EXPECTATIONS["missing" if not secret.get("value") else "ok"]


def test_hostile_bootstrap_secrets_end_in_a_clear_condition_and_leave_nothing(case, hostile_host):
    spec = {"image": {"volume": BASE}, "storagePool": hostile_host.pool_name, "domainType": "qemu", "memoryMiB": 128,
            "cpus": 1, "interfaces": [{"network": hostile_host.network_name}]}

    @hostile(8)
    @given(SECRETS)
    @example({"format": b"cloud-config"})  # bug 5: no value: the machine booted with empty user-data
    @example({"value": b"", "format": b"cloud-config"})  # bug 5
    @example({"value": SECRET_MARK, "format": b"\xff\xfe"})  # bug 6: a non-UTF-8 format was a ReconcileError loop
    @example({"value": SECRET_MARK})  # no format: cloud-config, as Cluster API's contract has it
    @example({"value": cloud_config("binary", SECRET_LIMIT - len(SECRET_MARK) - 16), "format": b"cloud-config"})
    @example({"value": cloud_config("gzip", 64 * 1024), "format": b"cloud-config"})
    @example({"value": SECRET_MARK + blob(4096, 3, "binary"), "format": b"ignition"})  # any bytes, through fw_cfg
    @example(None)  # no Secret at all
    def one(secret: dict[str, bytes] | None) -> None:
        case(unique("boot"), {}, spec, secret, expect=expectation(secret))

    before = COUNTS["reconcile: cases on libvirtd"]
    one()
    assert COUNTS["reconcile: cases on libvirtd"] - before >= 15


def test_preset_provider_ids_are_refused_or_adopted_never_placed_again(case, hostile_host):
    spec = {"image": {"volume": BASE}, "storagePool": hostile_host.pool_name, "domainType": "qemu", "memoryMiB": 128,
            "cpus": 1, "interfaces": [{"network": hostile_host.network_name}]}

    @hostile(2)
    @given(st.sampled_from([f"libvirt://{hostile_host.name}/{uuid.UUID(int=7)}", "libvirt://nohost/" + str(uuid.UUID(int=1)),
                            "x" * 512, "libvirt://<h>/&'\"", "libvirt://h/ü名"]))
    @example(f"libvirt://{hostile_host.name}/{uuid.UUID(int=7)}")
    @example("libvirt://nohost/" + str(uuid.UUID(int=1)))
    @example("]]><!--$(reboot)")
    def one(provider_id: str) -> None:
        case(unique("preset"), {}, {**spec, "providerID": provider_id},
             {"value": SECRET_MARK, "format": b"cloud-config"},
             expect={reasons.ADOPTION_REFUSED, reasons.HOST_UNREACHABLE, "HostNotFound"})

    before = COUNTS["reconcile: cases on libvirtd"]
    one()
    assert COUNTS["reconcile: cases on libvirtd"] - before >= 5
