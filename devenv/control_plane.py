"""A real etcd + kube-apiserver on loopback ports, with the provider's and Cluster API's CRDs installed.

Used by the test bed and by `make run` when no cluster is reachable. The binaries come from hack/build-upstream.sh
(cached by version); the processes are started here and stopped by PID. The certificates are made by kubeadm's own
phases, as for a kubeadm cluster (devenv/kubeadm_phases.py): a cluster CA that the kubeconfigs pin (TLS is verified
as everywhere else) and that signs kubelets' client certificates. People and programs of the test bed authenticate
with static tokens; kubelets of joined guests with their certificates (Node authorizer, NodeRestriction), and joining
ones with bootstrap tokens once accept_joins() has prepared the server for `kubeadm join`.
"""

from __future__ import annotations

import base64
import json
import logging
import pathlib
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

import yaml

from devenv import kubeadm_phases, paths

log = logging.getLogger(__name__)

# No traffic ever goes to service IPs here (no kube-proxy); the range is outside the private ranges all the same.
SERVICE_CLUSTER_IP_RANGE = "100.64.0.0/24"


# kind -> (API prefix, plural, namespaced): the kinds a provider's components hold, for apply_objects.
COLLECTIONS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Service": ("/api/v1", "services", True),
    "Secret": ("/api/v1", "secrets", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "MutatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", False),
    "ValidatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1", "validatingwebhookconfigurations",
                                       False),
}


class ControlPlaneError(RuntimeError):
    """The local control plane could not be started or used; `status` is the HTTP status of a refused request."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalControlPlane:
    """etcd and kube-apiserver as child processes; `start()` returns when the API serves and the CRDs are established."""

    def __init__(self, workdir: pathlib.Path | None = None, crd_dirs: Iterable[pathlib.Path] = (),
                 users: Iterable[str] = (), serving_addresses: Iterable[str] = ()) -> None:
        """`users`: extra identities with no rights of their own (bind roles to them), each with a kubeconfig.
        `serving_addresses`: where else guests reach the API server (API gateways), for its certificate."""
        self.workdir = workdir or pathlib.Path(tempfile.mkdtemp(prefix="capi-libvirt-cp-"))
        self.crd_dirs = list(crd_dirs)
        self.serving_addresses = list(serving_addresses)
        self.token = secrets.token_hex(24)
        self.user_tokens = {user: secrets.token_hex(24) for user in users}
        self.etcd_port = free_port()
        self.secure_port = free_port()
        self._processes: list[tuple[str, subprocess.Popen]] = []
        self._ssl: ssl.SSLContext | None = None

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.secure_port}"

    @property
    def kubeconfig_path(self) -> pathlib.Path:
        return self.workdir / "kubeconfig"

    @property
    def cert_dir(self) -> pathlib.Path:
        return self.workdir / "certs"

    @property
    def ca_file(self) -> pathlib.Path:
        """The cluster CA: it issued the API server's certificate and signs kubelets' client certificates."""
        return self.cert_dir / "ca.crt"

    @property
    def ca_key_file(self) -> pathlib.Path:
        return self.cert_dir / "ca.key"

    def kubeadm_config_path(self, for_nodes: bool = False) -> pathlib.Path:
        """kubeadm's configuration of this API server: as the certs phases read it, or as joining nodes get it."""
        return self.workdir / ("kubeadm-for-nodes.yaml" if for_nodes else "kubeadm.yaml")

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> LocalControlPlane:
        for binary in (paths.etcd_binary(), paths.kube_apiserver_binary(), paths.kubeadm_binary()):
            if not binary.exists():
                raise ControlPlaneError(f"{binary} is missing: run `make upstream` (hack/build-upstream.sh)")
        try:
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig()
            for directory in self.crd_dirs:
                self.install_crds(sorted(directory.glob("*.yaml")))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for name, process in reversed(self._processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            log.info("stopped %s (pid %d)", name, process.pid)
        self._processes.clear()

    def __enter__(self) -> LocalControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "wb") as logfile:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(argv, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True)
        self._processes.append((name, process))
        log.info("started %s (pid %d), log %s", name, process.pid, self.workdir / f"{name}.log")
        return process

    def _start_etcd(self) -> None:
        self._spawn("etcd", [
            str(paths.etcd_binary()),
            "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{free_port()}",
            "--unsafe-no-fsync",  # test data: durability is not wanted, speed is
            "--log-level", "warn",
        ])

    def _start_apiserver(self) -> None:
        certs = self.cert_dir
        certs.mkdir(exist_ok=True)
        for cert_dir, for_nodes in ((certs, False), (None, True)):
            kubeadm_phases.write_configuration(self.kubeadm_config_path(for_nodes), kubeadm_phases.kubeadm_configuration(
                cert_dir, self.secure_port, SERVICE_CLUSTER_IP_RANGE, self.serving_addresses))
        kubeadm_phases.make_certificates(self.kubeadm_config_path())
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(f"{self.token},admin,admin,system:masters\n"
                          + "".join(f"{token},{user},{user}\n" for user, token in self.user_tokens.items()))
        tokens.chmod(0o600)
        self._spawn_apiserver()

    def _spawn_apiserver(self) -> None:
        certs, tokens = self.cert_dir, self.workdir / "tokens.csv"
        self._spawn("kube-apiserver", [
            str(paths.kube_apiserver_binary()),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.secure_port}",
            f"--tls-cert-file={certs / 'apiserver.crt'}",
            f"--tls-private-key-file={certs / 'apiserver.key'}",
            f"--client-ca-file={self.ca_file}",
            f"--token-auth-file={tokens}",
            "--enable-bootstrap-token-auth=true",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--service-account-key-file={certs / 'sa.pub'}",
            f"--service-account-signing-key-file={certs / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            # A webhook given by Service (what clusterctl installs) is reached at an address of the Service's
            # EndpointSlices (written by the test bed: devenv/service_address.py), never at its ClusterIP: nothing
            # serves ClusterIPs here, and they would be dialled through the default route.
            "--enable-aggregator-routing=true",
        ])
        self._wait_ready()

    def kill_and_restart_apiserver(self) -> tuple[int, int]:
        """SIGKILL kube-apiserver (etcd keeps the data) and start it again on the same port with the same certificates
        and tokens; returns once it is ready again. (old pid, new pid)"""
        (index, (_, old)), = [(i, entry) for i, entry in enumerate(self._processes) if entry[0] == "kube-apiserver"]
        old.kill()
        old.wait()
        del self._processes[index]
        log.info("killed kube-apiserver (pid %d)", old.pid)
        self._spawn_apiserver()
        return old.pid, self._processes[-1][1].pid

    def _wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        last_error = "not started"
        while time.monotonic() < deadline:
            for name, process in self._processes:
                if process.poll() is not None:
                    tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise ControlPlaneError(f"{name} exited with {process.returncode}:\n{tail}")
            if self.ca_file.exists():
                try:
                    self.request("GET", "/readyz")
                    log.info("kube-apiserver ready at %s", self.server)
                    return
                except (OSError, ControlPlaneError) as error:
                    last_error = str(error)
            time.sleep(0.3)
        raise ControlPlaneError(f"kube-apiserver not ready after {timeout:.0f}s: {last_error}")

    def kubeconfig_for(self, user: str) -> pathlib.Path:
        return self.workdir / f"kubeconfig-{user}"

    def _write_kubeconfig(self) -> None:
        for path, user, token in [(self.kubeconfig_path, "admin", self.token)] + [
                (self.kubeconfig_for(user), user, token) for user, token in self.user_tokens.items()]:
            self._write_kubeconfig_file(path, user, token)

    def cluster_kubeconfig(self) -> bytes:
        """The admin's kubeconfig as Cluster API writes it into a `<cluster>-kubeconfig` Secret: everything inline (the
        CA as certificate-authority-data), nothing that names a file of the reader's."""
        config = yaml.safe_load(self.kubeconfig_path.read_text())
        cluster = config["clusters"][0]["cluster"]
        cluster["certificate-authority-data"] = base64.b64encode(
            pathlib.Path(cluster.pop("certificate-authority")).read_bytes()).decode()
        return yaml.safe_dump(config).encode()

    def _write_kubeconfig_file(self, path: pathlib.Path, user: str, token: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local",
                          "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)

    def service_account_token(self, namespace: str, account: str, seconds: int = 7200,
                              timeout: float = 60.0) -> str:
        """A token of the ServiceAccount from the TokenRequest API (what a kubelet mounts in a pod), once it exists."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", {
                    "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "spec": {"expirationSeconds": seconds}})["status"]["token"]
            except ControlPlaneError as error:
                if error.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    def service_account_kubeconfig(self, namespace: str, account: str, path: pathlib.Path) -> pathlib.Path:
        """A kubeconfig logging in as the ServiceAccount: how a pod of its Deployment would authenticate."""
        self._write_kubeconfig_file(path, f"system:serviceaccount:{namespace}:{account}",
                                    self.service_account_token(namespace, account))
        return path

    def accept_joins(self, server: str) -> None:
        """Prepare the API server for `kubeadm join` as `kubeadm init` does, with `server` (an API gateway's URL: an
        address in `serving_addresses`) as the server joining nodes are told to use."""
        kubeadm_phases.prepare_for_joins(self.kubeadm_config_path(for_nodes=True), self.kubeconfig_path)
        cluster_info = self.request("GET", kubeadm_phases.CLUSTER_INFO)
        cluster_info["data"]["kubeconfig"] = kubeadm_phases.with_server(cluster_info["data"]["kubeconfig"], server)
        self.request("PUT", kubeadm_phases.CLUSTER_INFO, cluster_info)

    def apply(self, collection: str, document: dict) -> None:
        """Create the object, or replace it when it exists."""
        self._create_or_replace(collection, document)

    def apply_objects(self, documents: Iterable[dict | None]) -> list[str]:
        """Create or replace each object of a manifest (what `kubectl apply -f` of a components file does here): CRDs
        first, waited on until served, then the rest in the manifest's order. Returns `Kind namespace/name` of each.
        A kind missing from COLLECTIONS is an error naming it, never skipped."""
        documents = [d for d in documents if d]
        self.install_crd_documents(documents)
        applied = []
        for document in documents:
            kind, metadata = document["kind"], document["metadata"]
            if kind == "CustomResourceDefinition":
                applied.append(f"{kind} {metadata['name']}")
                continue
            if kind not in COLLECTIONS:
                raise ControlPlaneError(f"apply_objects: no collection known for kind {kind} ({metadata['name']})")
            prefix, plural, namespaced = COLLECTIONS[kind]
            where = f"/namespaces/{metadata['namespace']}" if namespaced else ""
            self._create_or_replace(f"{prefix}{where}/{plural}", document)
            applied.append(f"{kind} {metadata.get('namespace', '')}/{metadata['name']}")
        return applied

    def delete_objects(self, documents: Iterable[dict | None], *, keep: Iterable[str] = ("CustomResourceDefinition",
                                                                                        "Namespace")) -> None:
        """Delete what apply_objects applied, last first, but the kinds in `keep` (by default CRDs, which other tests
        of a shared API server use, and Namespaces, which stay Terminating where no namespace controller runs).
        Objects already gone are fine."""
        for document in reversed([d for d in documents if d and d["kind"] not in set(keep)]):
            prefix, plural, namespaced = COLLECTIONS[document["kind"]]
            metadata = document["metadata"]
            where = f"/namespaces/{metadata['namespace']}" if namespaced else ""
            try:
                self.request("DELETE", f"{prefix}{where}/{plural}/{metadata['name']}")
            except ControlPlaneError as error:
                if error.status != 404:
                    raise

    def grant(self, role: dict, user: str) -> None:
        """Create (or replace) `role`, a ClusterRole or a Role (in its namespace), and bind it to `user` alone."""
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        namespace = role["metadata"].get("namespace")
        prefix = f"{rbac}/namespaces/{namespace}" if role["kind"] == "Role" else rbac
        kind = "RoleBinding" if role["kind"] == "Role" else "ClusterRoleBinding"
        self.apply(f"{prefix}/{role['kind'].lower()}s", role)
        name = role["metadata"]["name"]
        metadata = {"name": f"{name}-{user}", **({"namespace": namespace} if namespace else {})}
        self.apply(f"{prefix}/{kind.lower()}s", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role["kind"], "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        })

    def bind_in_namespace(self, cluster_role: str, namespace: str, subject: dict) -> None:
        """A RoleBinding in `namespace` of ClusterRole `cluster_role` to `subject` (an RBAC subject: a User, a
        ServiceAccount): the role's rights in that namespace alone, as the provider's Secrets role is bound."""
        self.apply(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"{cluster_role}-{subject['name']}", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [subject],
        })

    def ensure_namespace(self, name: str) -> None:
        """Create namespace `name` unless it exists."""
        try:
            self.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": name}})
        except ControlPlaneError as error:
            if error.status != 409:
                raise

    # -- a minimal client, enough to install CRDs before any operator runs ------------------------------------

    def request(self, method: str, path: str, body: Any = None, accept: str = "application/json",
                content_type: str = "application/json", as_user: str | None = None) -> Any:
        """`content_type` names the body's kind for PATCH, e.g. `application/apply-patch+yaml` (a JSON body is YAML);
        `as_user`: the request is made as that user (the admin impersonates it), with that user's rights alone."""
        if self._ssl is None and self.ca_file.exists():
            self._ssl = ssl.create_default_context(cafile=str(self.ca_file))
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Content-Type", content_type)
        req.add_header("Accept", accept)
        if as_user is not None:
            req.add_header("Impersonate-User", as_user)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=10) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            raise ControlPlaneError(f"{method} {path}: {error.code} {detail}", status=error.code) from None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def install_crds(self, files: Iterable[pathlib.Path]) -> None:
        """Create (or replace) every CRD in the files and wait until each is established."""
        self.install_crd_documents(d for file in files for d in yaml.safe_load_all(file.read_text()))

    def install_crd_documents(self, documents: Iterable[dict | None]) -> None:
        """Create (or replace) every CRD among the documents and wait until each is established."""
        names = []
        for document in documents:
            if not document or document.get("kind") != "CustomResourceDefinition":
                continue
            names.append(document["metadata"]["name"])
            self._create_or_replace("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", document)
        for name in names:
            self._wait_established(name)
        log.info("installed %d CRDs", len(names))

    def _create_or_replace(self, collection: str, document: dict) -> None:
        try:
            self.request("POST", collection, document)
        except ControlPlaneError as error:
            if error.status != 409:
                raise
            current = self.request("GET", f"{collection}/{document['metadata']['name']}")
            document = {**document, "metadata": {**document["metadata"],
                                                 "resourceVersion": current["metadata"]["resourceVersion"]}}
            self.request("PUT", f"{collection}/{document['metadata']['name']}", document)

    def _wait_established(self, name: str, timeout: float = 30.0) -> None:
        """Established, and served: a LIST answers (not 429 "storage is (re)initializing"), so watchers start clean."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            if conditions.get("Established") == "True":
                served = next(v["name"] for v in crd["spec"]["versions"] if v.get("served"))
                try:
                    self.request("GET", f"/apis/{crd['spec']['group']}/{served}/{crd['spec']['names']['plural']}?limit=1")
                    return
                except ControlPlaneError as error:
                    if error.status != 429:
                        raise
            time.sleep(0.1)
        raise ControlPlaneError(f"CRD {name} not established and served after {timeout:.0f}s")
