"""The operator's configuration: which libvirt hosts it manages, from the command line or the environment."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence

from capi_libvirt.api import meta
from capi_libvirt.core.outage import DEFAULT_REPLACE_AFTER_S
from capi_libvirt.core.placement import DEFAULT_CREATES_PER_HOST
from capi_libvirt.kube import api
from capi_libvirt.reconcile.base import ORPHAN_GRACE_S
from capi_libvirt.reconcile.inventory import PROBE_INTERVAL_S as DEFAULT_PROBE_INTERVAL_S
from capi_libvirt.reconcile.orphans import INTERVAL_S as ORPHAN_INTERVAL_S

MANAGEMENT_CLUSTER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")  # a UID, a name: it goes into domain XML
HOST_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS label, as status.host and providerIDs take
HOSTS_ENV = "CAPI_LIBVIRT_HOSTS"  # "name=uri,name=uri"
MANAGEMENT_CLUSTER_ENV = "CAPI_LIBVIRT_MANAGEMENT_CLUSTER_ID"  # else the kube-system Namespace's UID
ORPHAN_GRACE_ENV = "CAPI_LIBVIRT_ORPHAN_GRACE_PERIOD"  # seconds, or "never" (report orphans, never remove them)
NAMESPACE_ENV = "POD_NAMESPACE"  # the Deployment sets it from the pod's namespace (the downward API)
DEFAULT_WORKERS = 16  # machine reconciles at once (each mostly waits on libvirt or the API)
DEFAULT_KUBE_API_BURST = 30  # Cluster API's managers' burst, for when --kube-api-qps limits the client
DEFAULT_SYNC_PERIOD_S = 600.0  # every machine reconciled at least this often (Cluster API's managers: 10 minutes)


@dataclasses.dataclass(frozen=True)
class EnvironmentVariable:
    name: str
    meaning: str


# Every environment variable the product reads (the book's reference is generated from this list, and a test fails
# when the code reads one that is not here).
ENVIRONMENT = (
    EnvironmentVariable(HOSTS_ENV, "Static libvirt hosts beside the LibvirtHost objects, `name=uri,name=uri` "
                        "(`run --host` and `console-log --host` add to them)."),
    EnvironmentVariable(MANAGEMENT_CLUSTER_ENV, "This management cluster's identity in domains' owner metadata, when "
                        "`--management-cluster-id` is not given (else the kube-system Namespace's UID)."),
    EnvironmentVariable(ORPHAN_GRACE_ENV, "Seconds an orphaned domain waits before it is removed, or `never`, when "
                        "`--orphan-grace-period` is not given."),
    EnvironmentVariable(NAMESPACE_ENV, "The provider's own namespace (the Deployment sets it from the pod's): the only "
                        "one LibvirtHost credentials Secrets may live in."),
    EnvironmentVariable("KUBECONFIG", "The kubeconfig to use outside a pod (`--kubeconfig` sets it)."),
    EnvironmentVariable("KUBERNETES_SERVICE_HOST", "Set by Kubernetes in a pod: with no KUBECONFIG, the in-cluster "
                        "ServiceAccount is used and logs default to JSON."),
    EnvironmentVariable("KUBERNETES_SERVICE_PORT", "Set by Kubernetes in a pod: the API server's port in-cluster "
                        "(default 443)."),
    EnvironmentVariable("HTTPS_PROXY", "An http:// proxy for https image URLs (spec.image.url), reached by CONNECT, "
                        "TLS to the image server end to end; credentials in it go as Proxy-Authorization. Lowercase "
                        "too."),
    EnvironmentVariable("HTTP_PROXY", "An http:// proxy for http image URLs. Lowercase too."),
    EnvironmentVariable("NO_PROXY", "Hosts and domains image downloads reach directly: comma-separated names (a "
                        "leading dot or not), an optional :port, or `*`. Lowercase too."),
    EnvironmentVariable("SSL_CERT_FILE", "A CA bundle that replaces the system's for image downloads over https "
                        "(OpenSSL's variable): a private CA's image server."),
)


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    hosts: dict[str, str]  # host name (as in providerIDs) -> libvirt URI
    workers: int = DEFAULT_WORKERS
    creates_per_host: int = DEFAULT_CREATES_PER_HOST
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S  # how often every host is probed
    replace_after_s: float = DEFAULT_REPLACE_AFTER_S  # an unreachable host's machines with no domain move after this
    # This management cluster's identity in domains' owner metadata (None: the kube-system Namespace's UID). Give it
    # when the management cluster may be rebuilt around the same hosts and must recognise its domains.
    management_cluster_id: str | None = None
    orphan_grace_s: float | None = ORPHAN_GRACE_S  # None: orphans are reported, never removed
    orphan_interval_s: float = ORPHAN_INTERVAL_S
    sync_period_s: float = DEFAULT_SYNC_PERIOD_S
    # --watch-filter: only LibvirtMachines, LibvirtClusters and templates labelled cluster.x-k8s.io/watch-filter=THIS
    # are reconciled (None: all). LibvirtHosts are the shared inventory: every instance probes them.
    watch_filter: str | None = None
    # --kube-api-qps, --kube-api-burst: the operator's own API client's rate (None: not limited)
    kube_api_qps: float | None = None
    kube_api_burst: int = DEFAULT_KUBE_API_BURST
    # The provider's own namespace: the only one LibvirtHost credentials Secrets may live in (see api.meta).
    provider_namespace: str = meta.PROVIDER_NAMESPACE


def parse_hosts(entries: list[str]) -> dict[str, str]:
    """`name=uri` entries; the name must be a DNS label, since it goes into providerIDs."""
    hosts: dict[str, str] = {}
    for entry in entries:
        name, sep, uri = entry.partition("=")
        if not sep or not uri:
            raise ValueError(f"host entry {entry!r}: expected name=uri")
        if not HOST_NAME.match(name):
            raise ValueError(f"host name {name!r}: must be a lowercase DNS label")
        hosts[name] = uri
    return hosts


def check_management_cluster_id(value: str) -> str:
    """A management cluster identity of letters, digits and . _ : - (at most 253): what goes into owner metadata."""
    if not MANAGEMENT_CLUSTER_ID.match(value):
        raise ValueError(f"management cluster id {value!r}: letters, digits and . _ : - only, at most 253")
    return value


def parse_grace_period(value: str) -> float | None:
    """Seconds (>= 0) before an orphan is removed, or "never" (None): report only."""
    if value.strip().lower() == "never":
        return None
    seconds = float(value)
    if not seconds >= 0:
        raise ValueError(f"orphan grace period {value!r}: expected seconds >= 0 or 'never'")
    return seconds


def _management_cluster_id(given: str | None) -> str | None:
    value = given or os.environ.get(MANAGEMENT_CLUSTER_ENV) or None
    return None if value is None else check_management_cluster_id(value)


def provider_namespace() -> str:
    """$POD_NAMESPACE, else the ServiceAccount's namespace in a pod, else capi-libvirt-system."""
    if os.environ.get(NAMESPACE_ENV):
        return os.environ[NAMESPACE_ENV]
    try:
        with open(api.SERVICE_ACCOUNT_NAMESPACE) as file:
            return file.read().strip() or meta.PROVIDER_NAMESPACE
    except OSError:
        return meta.PROVIDER_NAMESPACE


def from_environment(extra_hosts: Sequence[str] = (), *, workers: int = DEFAULT_WORKERS,
                     creates_per_host: int = DEFAULT_CREATES_PER_HOST,
                     probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                     replace_after_s: float = DEFAULT_REPLACE_AFTER_S, management_cluster_id: str | None = None,
                     orphan_grace: str | None = None, orphan_interval_s: float = ORPHAN_INTERVAL_S,
                     sync_period_s: float = DEFAULT_SYNC_PERIOD_S, watch_filter: str | None = None,
                     kube_api_qps: float | None = None, kube_api_burst: int = DEFAULT_KUBE_API_BURST) -> OperatorConfig:
    entries = [e for e in os.environ.get(HOSTS_ENV, "").split(",") if e.strip()] + list(extra_hosts)
    grace = orphan_grace or os.environ.get(ORPHAN_GRACE_ENV)
    return OperatorConfig(hosts=parse_hosts([e.strip() for e in entries]),
                          workers=workers, creates_per_host=creates_per_host, probe_interval_s=probe_interval_s,
                          replace_after_s=replace_after_s, provider_namespace=provider_namespace(),
                          management_cluster_id=_management_cluster_id(management_cluster_id),
                          orphan_grace_s=ORPHAN_GRACE_S if grace is None else parse_grace_period(grace),
                          orphan_interval_s=orphan_interval_s, sync_period_s=sync_period_s,
                          watch_filter=watch_filter or None, kube_api_qps=kube_api_qps, kube_api_burst=kube_api_burst)


def watched(labels: dict[str, str] | None, watch_filter: str | None) -> bool:
    """Whether an object with these labels is this instance's to reconcile under --watch-filter."""
    return watch_filter is None or (labels or {}).get(meta.WATCH_FILTER_LABEL) == watch_filter
