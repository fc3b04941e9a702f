"""Where the test API server reaches a Service's webhook server: a local address and an EndpointSlice per Service.

With `--enable-aggregator-routing=true` (LocalControlPlane sets it) kube-apiserver sends admission and conversion
webhook calls given by Service to an address of the Service's EndpointSlices (label `kubernetes.io/service-name`, the
slice port named as the Service's port), keeping `<service>.<namespace>.svc` as the TLS server name. No kubelet or
endpoint controller runs here, so the test bed writes the slices itself, each pointing at the local port of the
process serving that Service.

The address: the API server refuses loopback addresses in EndpointSlices, and no private range may be used on this
machine's own network. So ServiceAddress puts ADDRESS, a /32 of the benchmarking range 198.18.0.0/15 (the libvirt
links use 198.18.<n>.0/30; this takes one from the other half), on `lo`, where the kernel treats it as local, and
checks with `ip route get` that it is before any slice names it (without it the address would go through the default
route). stop() removes it again, if start() added it (an address found on `lo` may be another test bed's; one left
by a killed run goes with `ip addr del 198.19.255.1/32 dev lo`). Test beds running side by side each take their own
address of the same /24 (ServiceAddress(address); devenv/management_cluster.py: 198.19.255.2 and .3 for the move test).
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterable

from devenv.control_plane import LocalControlPlane

log = logging.getLogger(__name__)

ADDRESS = "198.19.255.1"
MANAGED_BY = "test-bed.capi-libvirt"  # endpointslice.kubernetes.io/managed-by of the slices written here


class ServiceAddressError(RuntimeError):
    """The address could not be added, or it is not local: no slice may name it."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise ServiceAddressError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def is_local(address: str) -> bool:
    """The kernel delivers packets for `address` on this machine (`ip route get` says `local ... dev lo`)."""
    route = ip("route", "get", address, check=False).stdout.split()
    return route[:1] == ["local"] and "lo" in route


class ServiceAddress:
    """ADDRESS/32 on `lo` while started; a context manager. Only one test bed may use an address at a time."""

    def __init__(self, address: str = ADDRESS) -> None:
        self.address = address
        self._added = False

    def start(self) -> ServiceAddress:
        if not is_local(self.address):
            ip("addr", "add", f"{self.address}/32", "dev", "lo")
            self._added = True
            log.info("%s/32 added to lo", self.address)
        self.check_local()
        return self

    def check_local(self) -> None:
        if not is_local(self.address):
            raise ServiceAddressError(f"{self.address} is not local (ip route get: "
                                      f"{ip('route', 'get', self.address, check=False).stdout.strip()})")

    def stop(self) -> None:
        if self._added:
            ip("addr", "del", f"{self.address}/32", "dev", "lo", check=False)
            self._added = False
            log.info("%s/32 removed from lo", self.address)

    def __enter__(self) -> ServiceAddress:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def point(self, plane: LocalControlPlane, namespace: str, service: str, port_name: str, port: int) -> None:
        """The Service's namespace (clusterctl updates it later) and an EndpointSlice sending the Service's port
        `port_name` to ADDRESS:`port`."""
        self.check_local()
        plane.request("PATCH", f"/api/v1/namespaces/{namespace}?fieldManager={MANAGED_BY}&force=true",
                      {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                      content_type="application/apply-patch+yaml")
        name = f"{service}-test-bed"
        plane.request(
            "PATCH", f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices/{name}"
                     f"?fieldManager={MANAGED_BY}&force=true",
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": name, "namespace": namespace,
                          "labels": {"kubernetes.io/service-name": service,
                                     "endpointslice.kubernetes.io/managed-by": MANAGED_BY}},
             "addressType": "IPv4",
             "endpoints": [{"addresses": [self.address], "conditions": {"ready": True}}],
             "ports": [{"name": port_name, "port": port, "protocol": "TCP"}]},
            content_type="application/apply-patch+yaml")
        log.info("Service %s/%s port %r -> %s:%d", namespace, service, port_name, self.address, port)


def webhook_services(documents: Iterable[dict | None]) -> dict[tuple[str, str], str]:
    """(namespace, Service name) -> the name of the Service port that components' webhooks call: every Service named by
    a Mutating/ValidatingWebhookConfiguration or a CRD's conversion webhook, its port matched among the Services of the
    same documents ("" for an unnamed port)."""
    documents = [d for d in documents if d]
    ports = {(d["metadata"].get("namespace", ""), d["metadata"]["name"]): d["spec"].get("ports", [])
             for d in documents if d.get("kind") == "Service"}
    services: dict[tuple[str, str], str] = {}
    for document in documents:
        kind = document.get("kind")
        if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            configs = [w["clientConfig"] for w in document.get("webhooks", [])]
        elif kind == "CustomResourceDefinition":
            configs = [((document["spec"].get("conversion") or {}).get("webhook") or {}).get("clientConfig") or {}]
        else:
            continue
        for config in configs:
            service = config.get("service")
            if not service:
                continue
            key = (service["namespace"], service["name"])
            port = service.get("port", 443)
            named = [p.get("name", "") for p in ports.get(key, []) if p["port"] == port]
            if not named:
                raise ServiceAddressError(f"no port {port} on Service {key[0]}/{key[1]} in the components")
            services[key] = named[0]
    return services
