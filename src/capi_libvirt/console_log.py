"""`capi-libvirt console-log`: a LibvirtMachine's serial console log (cloud-init, kubeadm join), read from its host.

The machine's host is the one its status names, reached the way the operator reaches it: through the LibvirtHost
object and its credentials Secret, read with the user's kubeconfig, or through a `--host NAME=URI` of the command line
(hosts without objects, as `run --host`). The log is downloaded over that libvirt connection
(hypervisor.serial_log.read_serial_log), so a remote host needs no login. The user needs `get` on the LibvirtMachine,
the LibvirtHost and its credentials Secret. Every failure is a ConsoleLogError or a HypervisorError whose text is
safe to print: no URI query, no credentials.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable
from typing import Any, BinaryIO, TypeVar

import pydantic

from capi_libvirt.api import v1alpha1, v1alpha1_host
from capi_libvirt.core import conditions, naming
from capi_libvirt.hypervisor import connection, credentials, serial_log
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.kube import api
from capi_libvirt.kube.client import ApiError

T = TypeVar("T")
FOLLOW_INTERVAL_S = 1.0
TAIL_WINDOW = 64 * 1024  # the first read of a --tail; grown fourfold while it holds fewer lines than asked
DEFAULT_POOL = v1alpha1.LibvirtMachineSpec.model_fields["storage_pool"].default


class ConsoleLogError(Exception):
    """Why the log cannot be shown, in one line for the user."""


@dataclasses.dataclass(frozen=True)
class SerialLog:
    """Where a machine's serial log is: its host, the storage pool and the log's volume name there."""

    host: str
    pool: str
    volume: str


def parse_machine_ref(value: str, namespace: str | None = None) -> tuple[str, str]:
    """NAMESPACE/NAME, or NAME in `namespace` -> (namespace, name)."""
    given, sep, name = value.partition("/")
    if not sep:
        given, name = namespace or "", value
    if not given or not name or "/" in name:
        raise ValueError(f"{value!r}: expected NAME (with -n NAMESPACE) or NAMESPACE/NAME of a LibvirtMachine")
    return given, name


def last_lines(data: bytes, lines: int, whole: bool) -> bytes | None:
    """The last `lines` lines of `data` (a log's end; `whole`: its beginning too), as `kubectl logs --tail` counts
    them: a last line without its newline counts. None when `data` holds fewer lines than that and is not the whole
    log, so that a longer read is needed."""
    if lines == 0:
        return b""
    ends = [i for i, byte in enumerate(data) if byte == 0x0A]
    if data and not data.endswith(b"\n"):
        ends.append(len(data) - 1)
    if len(ends) > lines:
        return data[ends[-lines - 1] + 1:]
    return data if whole else None


class Limited:
    """Writes to `out` until `limit` bytes were written (None: no limit), as `kubectl logs --limit-bytes`."""

    def __init__(self, out: BinaryIO, limit: int | None) -> None:
        self.out, self.left = out, limit

    @property
    def full(self) -> bool:
        return self.left is not None and self.left <= 0

    def write(self, data: bytes) -> None:
        if self.left is not None:
            data, self.left = data[:self.left], self.left - len(data[:self.left])
        if data:
            self.out.write(data)
            self.out.flush()


def not_placed_message(body: dict[str, Any]) -> str:
    """A machine without a host yet; its Provisioned condition says what it waits for."""
    meta_ = body["metadata"]
    message = f"LibvirtMachine {meta_['namespace']}/{meta_['name']} is not placed on a host yet"
    provisioned = conditions.get_condition((body.get("status") or {}).get("conditions"), conditions.PROVISIONED)
    if provisioned and provisioned.get("reason"):
        detail = f": {provisioned['message']}" if provisioned.get("message") else ""
        message += f" ({provisioned['reason']}{detail})"
    return message


async def _api(what: str, call: Awaitable[T]) -> T:
    """An API call whose refusal (403, ...) becomes a one-line error naming what was read."""
    try:
        return await call
    except ApiError as error:
        detail = error.message or error.reason
        raise ConsoleLogError(f"cannot read {what}: {error.status} {detail}") from None


async def locate(kube: api.KubeAPI, namespace: str, name: str) -> SerialLog:
    """The machine's serial log, from the LibvirtMachine's status (host), spec (pool) and identity (volume name)."""
    body = await _api(f"LibvirtMachine {namespace}/{name}", kube.get_libvirt_machine(namespace, name))
    if body is None:
        raise ConsoleLogError(f"LibvirtMachine {namespace}/{name} not found")
    spec = body.get("spec") or {}
    if spec.get("serialLog") is False:
        raise ConsoleLogError(f"LibvirtMachine {namespace}/{name} has serialLog: false; its console is not logged")
    host = (body.get("status") or {}).get("host")
    if not host:
        raise ConsoleLogError(not_placed_message(body))
    return SerialLog(host=host, pool=spec.get("storagePool") or DEFAULT_POOL,
                     volume=naming.serial_log_file_name(namespace, name, naming.identity_uid(body)))


async def host_access(kube: api.KubeAPI, host: str,
                      static_hosts: dict[str, str]) -> tuple[str, credentials.Credentials | None]:
    """How the operator reaches the host: a `--host` URI, or the LibvirtHost's URI and credentials Secret."""
    if host in static_hosts:
        return static_hosts[host], None
    body = await _api(f"LibvirtHost {host}", kube.get_libvirt_host(host))
    if body is None:
        raise ConsoleLogError(f"LibvirtHost {host} not found (for a host without an object, pass --host {host}=URI)")
    try:
        spec = v1alpha1_host.LibvirtHostSpec.model_validate(body.get("spec") or {})
    except pydantic.ValidationError as error:
        fields = ", ".join(".".join(map(str, e["loc"])) for e in error.errors())
        raise ConsoleLogError(f"LibvirtHost {host} has an invalid spec: {fields}") from None
    ref = spec.credentials_secret_ref
    if ref is None:
        return spec.uri, None
    data = await _api(f"the credentials Secret {ref.namespace}/{ref.name} of LibvirtHost {host}",
                      kube.get_secret_data(ref.namespace, ref.name))
    if data is None:
        raise ConsoleLogError(f"credentials Secret {ref.namespace}/{ref.name} of LibvirtHost {host} not found")
    return spec.uri, credentials.Credentials(data)


async def show(kube: api.KubeAPI, namespace: str, name: str, out: BinaryIO, *, static_hosts: dict[str, str],
               tail_lines: int | None = None, limit_bytes: int | None = None, follow: bool = False,
               interval: float = FOLLOW_INTERVAL_S) -> None:
    """Write the machine's serial log (its last `tail_lines` lines; at most `limit_bytes` bytes in all) to `out`; with
    `follow`, then what is added, until cancelled, the limit is reached or the log goes away."""
    where = await locate(kube, namespace, name)
    uri, secret = await host_access(kube, where.host, static_hosts)
    connection.ensure_libvirt_event_loop()  # keepalives: a dead host is noticed instead of hanging a follow
    host = host_api.libvirt_host(where.host, uri, secret, None)
    output = Limited(out, limit_bytes)

    async def read(start: int, tail: int | None) -> serial_log.LogChunk:
        return await host.read_serial_log(where.pool, where.volume, start, tail)
    try:
        if tail_lines is None:
            chunk = await read(0, None)
            output.write(chunk.data)
        else:
            window = TAIL_WINDOW
            while True:
                chunk = await read(0, window)
                shown = last_lines(chunk.data, tail_lines, whole=len(chunk.data) == chunk.end)
                if shown is not None:
                    break
                window *= 4
            output.write(shown)
        while follow and not output.full:
            await asyncio.sleep(interval)
            chunk = await read(chunk.end, None)
            output.write(chunk.data)
    finally:
        await asyncio.get_running_loop().run_in_executor(None, host.close)
