"""The configuration of `capi-libvirt run`, each setting spelled once, as a field with its default and its Flag:
OperatorConfig (what the reconciles run with: hosts, concurrency, intervals, filters, the API client's rate) and
ManagerConfig (how the process runs around them, with the flags every Cluster API manager takes: leader election,
health and metrics endpoints, logs). The command line (cli.py) and the book's flag reference (hack/reference.py) are
made from these fields."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from capi_libvirt.api import meta
from capi_libvirt.core.outage import DEFAULT_REPLACE_AFTER_S
from capi_libvirt.core.placement import DEFAULT_CREATES_PER_HOST
from capi_libvirt.kube import kubeconfig
from capi_libvirt.operator import election, logs
from capi_libvirt.reconcile.base import ORPHAN_GRACE_S
from capi_libvirt.reconcile.inventory import PROBE_GIVE_UP_S
from capi_libvirt.reconcile.inventory import PROBE_INTERVAL_S as DEFAULT_PROBE_INTERVAL_S
from capi_libvirt.reconcile.inventory import PROBE_TIMEOUT_S as DEFAULT_PROBE_TIMEOUT_S
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
    EnvironmentVariable("LIBVIRT_LOG_OUTPUTS", "libvirt's own log outputs (libvirt's variable, e.g. `3:stderr`); "
                        "unset, libvirt's client library logs nothing (its errors reach the operator as errors)."),
)


GO_DURATION = re.compile(r"(\d+(?:\.\d*)?)(h|ms|m|s)")


def duration(value: str) -> float:
    """Seconds, from a Go duration as Cluster API's managers take it (15s, 1m30s, 500ms) or a plain number."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    try:
        seconds = float(value)
    except ValueError:
        parts = GO_DURATION.findall(value)
        if not parts or "".join(number + unit for number, unit in parts) != value:
            raise ValueError(f"{value!r}: expected a duration such as 15s, 1m30s or 500ms") from None
        seconds = sum(float(number) * units[unit] for number, unit in parts)
    if not seconds > 0:
        raise ValueError(f"{value!r}: expected a duration above 0")
    return seconds


def positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{value!r}: expected a whole number of at least 1")
    return int(value)


def _above_zero(what: str) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = 0.0
        if not number > 0:
            raise ValueError(f"{value!r}: expected a number of {what} above 0")
        return number
    parse.__name__ = what.replace(" ", "_")
    return parse


positive_seconds, positive_rate = _above_zero("seconds"), _above_zero("requests a second")


def _seconds(value: float) -> str:
    return f"{value:g}"


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a setting of `capi-libvirt run` is given: its flags (the first its name, the rest older or Cluster API
    names for it), how a value is read (a ValueError says what is wrong with it), its metavar and help ("{default}"
    is the setting's default as `shown`), and the environment variable read when no flag gives it."""

    names: tuple[str, ...]
    parse: Callable[[str], Any]
    metavar: str | None
    help: str
    env: str | None = None
    shown: Callable[[Any], str] = str
    optional_value: bool = False  # a boolean given alone means true (--leader-elect), as Go's boolean flags
    switch: bool = False  # takes no value: given means true (--standalone)
    exclusive: str | None = None  # flags of the same group exclude each other
    default_now: Callable[[], Any] | None = None  # a default read when the command line is made (the environment's)


def _setting(default: Any, flag: Flag) -> Any:
    """A field of OperatorConfig with its default and its flag: each setting is spelled here once."""
    return dataclasses.field(default=default, metadata={"flag": flag})


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    """Everything `capi-libvirt run` is configured with. The flags, the environment variables and the book's reference
    (hack/reference.py) are made from these fields: a setting is a field with its default and its Flag."""

    hosts: dict[str, str]  # host name (as in providerIDs) -> libvirt URI (--host, $CAPI_LIBVIRT_HOSTS)
    workers: int = _setting(DEFAULT_WORKERS, Flag(
        ("--libvirtmachine-concurrency", "--max-concurrent-reconciles", "--workers"), positive_int, "N",
        "LibvirtMachine reconciles at once (default: {default}; --max-concurrent-reconciles: the Cluster API "
        "Operator's name; --workers: its old name)"))
    creates_per_host: int = _setting(DEFAULT_CREATES_PER_HOST, Flag(
        ("--creates-per-host",), positive_int, "N",
        "machines created on one libvirt host at once; a burst queues behind them (default: {default})"))
    probe_interval_s: float = _setting(DEFAULT_PROBE_INTERVAL_S, Flag(
        ("--host-probe-interval",), positive_seconds, "SECONDS",
        "probe every libvirt host this often (default: {default})", shown=_seconds))
    probe_timeout_s: float = _setting(DEFAULT_PROBE_TIMEOUT_S, Flag(
        ("--host-probe-timeout",), positive_seconds, "SECONDS",
        "a host's probe not answered this long is slow (the host stays reachable while its connection lives) or, "
        "with no live connection, makes the host unreachable (default: {default}; at most "
        f"{PROBE_GIVE_UP_S:.0f}s, when an unanswered probe makes it unreachable in any case)", shown=_seconds))
    replace_after_s: float = _setting(DEFAULT_REPLACE_AFTER_S, Flag(
        ("--replace-unreachable-after",), positive_seconds, "SECONDS",
        "a machine that never had a domain on its host moves to another host when that host stays unreachable this "
        "long (default: {default})", shown=_seconds))
    # Give it when the management cluster may be rebuilt around the same hosts and must recognise its domains.
    management_cluster_id: str | None = _setting(None, Flag(
        ("--management-cluster-id",), lambda value: check_management_cluster_id(value), "ID",
        "this management cluster's identity in domains' owner metadata (default: $" + MANAGEMENT_CLUSTER_ENV
        + ", else the kube-system Namespace's UID)", env=MANAGEMENT_CLUSTER_ENV))
    orphan_grace_s: float | None = _setting(ORPHAN_GRACE_S, Flag(
        ("--orphan-grace-period",), lambda value: parse_grace_period(value), "SECONDS|never",
        "remove a domain this management cluster made whose LibvirtMachine is gone once it has been orphaned this "
        "long; never: report only (default: $" + ORPHAN_GRACE_ENV + ", else {default})", env=ORPHAN_GRACE_ENV,
        shown=lambda value: "never" if value is None else f"{value:.0f}"))
    orphan_interval_s: float = ORPHAN_INTERVAL_S
    sync_period_s: float = _setting(DEFAULT_SYNC_PERIOD_S, Flag(
        ("--sync-period",), duration, "DURATION",
        "reconcile every LibvirtMachine at least this often, whatever happened (default: {default}, as Cluster "
        "API's managers)", shown=lambda value: f"{value / 60:g}m"))
    # Only LibvirtMachines, LibvirtClusters and templates labelled cluster.x-k8s.io/watch-filter=THIS are reconciled
    # (None: all). LibvirtHosts are the shared inventory: every instance probes them.
    watch_filter: str | None = _setting(None, Flag(
        ("--watch-filter",), lambda value: value or None, "VALUE",
        "reconcile only LibvirtMachines, LibvirtClusters and LibvirtMachineTemplates labelled "
        "cluster.x-k8s.io/watch-filter=VALUE, as Cluster API's managers (LibvirtHosts are shared: every instance "
        "keeps the inventory; placement counts every machine)"))
    kube_api_qps: float | None = _setting(None, Flag(
        ("--kube-api-qps",), positive_rate, "QPS",
        "at most this many requests a second from the operator's own API client (kopf's watches aside), after a "
        "burst (default: not limited; Cluster API's managers default to 20)"))
    kube_api_burst: int = _setting(DEFAULT_KUBE_API_BURST, Flag(
        ("--kube-api-burst",), positive_int, "N", "requests at once before --kube-api-qps applies (default: {default})"))
    # The provider's own namespace: the only one LibvirtHost credentials Secrets may live in (see api.meta).
    provider_namespace: str = meta.PROVIDER_NAMESPACE


def settings(of: type = OperatorConfig) -> list[tuple[str, Flag, Any]]:
    """Every setting with a flag: (the field, its Flag, its default), in the fields' order, of OperatorConfig or
    ManagerConfig."""
    return [(field.name, field.metadata["flag"], field.default) for field in dataclasses.fields(of)
            if "flag" in field.metadata]


LEASE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
FEATURE_GATES: dict[str, bool] = {}  # this provider has none yet; Cluster API's managers refuse unknown gates too
DEBUG_VERBOSITY = 4  # Cluster API's managers log at debug from --v=4 on (klog's convention)
BOOLEANS = {"true": True, "t": True, "1": True, "false": False, "f": False, "0": False}


def boolean(value: str) -> bool:
    """true or false, as Go's flag package reads a boolean flag's value (--leader-elect=false)."""
    if value.lower() not in BOOLEANS:
        raise ValueError(f"{value!r}: expected true or false")
    return BOOLEANS[value.lower()]


def lease_name(value: str) -> str:
    """NAME, or NAMESPACE/NAME as the Cluster API Operator writes it (from spec.manager.leaderElection)."""
    namespace, _, name = value.rpartition("/")
    if not LEASE_NAME.match(name) or (namespace and not LEASE_NAME.match(namespace)):
        raise ValueError(f"lease {value!r}: expected NAME or NAMESPACE/NAME, lowercase DNS names")
    return value


def feature_gates(value: str) -> Mapping[str, bool]:
    gates = {}
    for entry in filter(None, (e.strip() for e in value.split(","))):
        name, sep, setting = entry.partition("=")
        if not sep or setting.lower() not in ("true", "false"):
            raise ValueError(f"feature gate {entry!r}: expected NAME=true or NAME=false")
        if name not in FEATURE_GATES:
            known = ", ".join(sorted(FEATURE_GATES)) or "none"
            raise ValueError(f"unrecognized feature gate {name!r} (this provider's: {known})")
        gates[name] = setting.lower() == "true"
    return gates


def address(value: str) -> str:
    """HOST:PORT, :PORT or 0 (off), as the health and metrics endpoints take it."""
    from capi_libvirt.operator import endpoints  # the web server, only where an address is read

    endpoints.parse_address(value)
    return value


def verbosity(value: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{value!r}: expected a verbosity of 0 or more")
    return int(value)


def log_format(value: str) -> str:
    chosen = {"text": logs.PLAIN}.get(value, value)  # Cluster API's name for it
    if chosen not in logs.FORMATS:
        raise ValueError(f"{value!r}: expected json or text")
    return chosen


def _duration_shown(value: float) -> str:
    return f"{value:g}s"


ELECTION = "election"


@dataclasses.dataclass(frozen=True)
class ManagerConfig:
    """How `capi-libvirt run` runs around the operator, with the flags every Cluster API manager takes (the
    Deployment, config/manager/manager.yaml, and the Cluster API Operator from spec.manager write them): leader
    election over a Lease, the health and metrics endpoints, logs."""

    leader_election_id: str = _setting(election.DEFAULT_LEASE_NAME, Flag(
        ("--leader-election-id", "--peering"), lease_name, "[NAMESPACE/]NAME",
        "the Lease (coordination.k8s.io; in the provider's namespace unless one is given) the replicas elect their "
        "leader in (default: {default}; --peering: its old name, deprecated)", exclusive=ELECTION))
    standalone: bool = _setting(False, Flag(
        ("--standalone",), boolean, None, "no leader election: run as if alone (development)", switch=True,
        exclusive=ELECTION))
    leader_elect: bool = _setting(True, Flag(
        ("--leader-elect",), boolean, "BOOL", "Cluster API's flag: true (the default) elects a leader among the "
        "replicas over the Lease; false runs as if alone, as --standalone", optional_value=True))
    leader_elect_lease_duration: float = _setting(election.DEFAULT_LEASE_DURATION_S, Flag(
        ("--leader-elect-lease-duration",), duration, "DURATION",
        "how long a standby waits for a silent leader before it takes over (default: {default})",
        shown=_duration_shown))
    leader_elect_renew_deadline: float = _setting(election.DEFAULT_RENEW_DEADLINE_S, Flag(
        ("--leader-elect-renew-deadline",), duration, "DURATION",
        "how long the leader keeps trying to renew before it gives up and exits (default: {default})",
        shown=_duration_shown))
    leader_elect_retry_period: float = _setting(election.DEFAULT_RETRY_PERIOD_S, Flag(
        ("--leader-elect-retry-period",), duration, "DURATION",
        "how often every replica tries to take or renew the Lease (default: {default})", shown=_duration_shown))
    feature_gates: Mapping[str, bool] | None = _setting(None, Flag(
        ("--feature-gates",), feature_gates, "NAME=BOOL,...",
        "Cluster API's flag; this provider has no feature gates yet, and refuses unknown ones"))
    health_address: str = _setting("0.0.0.0:8081", Flag(
        ("--health-addr", "--health-address"), address, "HOST:PORT",
        "serve /healthz and /readyz here (default: {default}; 0: off; --health-address: its old name)"))
    metrics_address: str = _setting(":8080", Flag(
        ("--metrics-bind-addr", "--metrics-address"), address, "HOST:PORT",
        "serve Prometheus /metrics here (default: {default}, every interface; 0: off; --metrics-address: its old "
        "name)"))
    diagnostics_address: str | None = _setting(None, Flag(
        ("--diagnostics-address",), address, "HOST:PORT",
        "Cluster API's newer name for the metrics address: taken only with --insecure-diagnostics (plain HTTP, as "
        "--metrics-bind-addr); authenticated metrics are not served yet"))
    insecure_diagnostics: bool = _setting(False, Flag(
        ("--insecure-diagnostics",), boolean, "BOOL",
        "with --diagnostics-address: serve the metrics over plain HTTP without authentication", optional_value=True))
    log_format: str | None = _setting(None, Flag(
        ("--logging-format", "--log-format"), log_format, "json|text",
        "json (one object per line) or text (default: json in a pod, text elsewhere; --log-format and `plain`: the "
        "old names)", default_now=logs.default_format))
    v: int = _setting(0, Flag(
        ("--v",), verbosity, "LEVEL",
        "log verbosity, as Cluster API's managers take it: 0 (default) info, 4 and above debug"))

    def served_metrics_address(self) -> str:
        """--metrics-bind-addr, or --diagnostics-address when --insecure-diagnostics says plain HTTP is what is
        wanted: without it Cluster API's managers serve authenticated HTTPS, which this one does not, and it will
        not serve plain HTTP in its place."""
        if self.diagnostics_address is None:
            return self.metrics_address
        if not self.insecure_diagnostics:
            raise ValueError("--diagnostics-address without --insecure-diagnostics asks for authenticated HTTPS "
                             "metrics, which this provider does not serve yet: add --insecure-diagnostics, or use "
                             "--metrics-bind-addr")
        return self.diagnostics_address

    def lease(self) -> election.Lease | None:
        """The Lease the replicas elect their leader in, in the provider's namespace; None: no election
        (--standalone, --leader-elect=false)."""
        if self.standalone or not self.leader_elect:
            return None
        namespace, _, name = self.leader_election_id.rpartition("/")
        return election.Lease(name=name, namespace=namespace or provider_namespace(),
                              identity=election.new_identity(), duration_s=self.leader_elect_lease_duration,
                              renew_deadline_s=self.leader_elect_renew_deadline,
                              retry_period_s=self.leader_elect_retry_period)


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
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"orphan grace period {value!r}: expected seconds >= 0 or 'never'")
    return seconds


def provider_namespace() -> str:
    """$POD_NAMESPACE, else the ServiceAccount's namespace in a pod, else capi-libvirt-system."""
    if os.environ.get(NAMESPACE_ENV):
        return os.environ[NAMESPACE_ENV]
    try:
        with open(kubeconfig.SERVICE_ACCOUNT_NAMESPACE) as file:
            return file.read().strip() or meta.PROVIDER_NAMESPACE
    except OSError:
        return meta.PROVIDER_NAMESPACE


def from_arguments(given: Mapping[str, Any], extra_hosts: Sequence[str] = ()) -> OperatorConfig:
    """The configuration from what the command line gave (`given`: field name -> value read by its Flag; a setting
    absent from it was not given), else each setting's environment variable, else its default; the static hosts
    from $CAPI_LIBVIRT_HOSTS and `extra_hosts` (--host)."""
    values = {}
    for name, flag, _default in settings():
        if name in given:
            values[name] = given[name]
        elif flag.env and os.environ.get(flag.env):
            values[name] = flag.parse(os.environ[flag.env])
    entries = [e for e in os.environ.get(HOSTS_ENV, "").split(",") if e.strip()] + list(extra_hosts)
    return OperatorConfig(hosts=parse_hosts([e.strip() for e in entries]), provider_namespace=provider_namespace(),
                          **values)


def watched(labels: dict[str, str] | None, watch_filter: str | None) -> bool:
    """Whether an object with these labels is this instance's to reconcile under --watch-filter."""
    return watch_filter is None or (labels or {}).get(meta.WATCH_FILTER_LABEL) == watch_filter
