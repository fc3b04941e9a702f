"""A Deployment's pod run the way a kubelet would run it, with podman: the stand-in for a node of the management cluster.

No kubelet with a container runtime can run pods on this machine's test API server, so PodmanPod reads the Deployment
as the API server holds it (what `clusterctl init` or `kubectl apply` put there) and runs its one container with podman:

- the image, command, args and plain `env` values of the container spec, exactly;
- the ServiceAccount of the pod spec: a token from the TokenRequest API (as a kubelet's projected volume gets it),
  the cluster CA and the namespace, at /var/run/secrets/kubernetes.io/serviceaccount, and KUBERNETES_SERVICE_HOST and
  KUBERNETES_SERVICE_PORT set, so the process inside logs in the in-cluster way;
- `runAsNonRoot` enforced as the kubelet enforces it: the image's user must be a non-zero UID;
- ready when the container's readinessProbe (httpGet) answers 200; stop() is the kubelet's SIGTERM with the pod's
  terminationGracePeriodSeconds, then the exit code.

The container shares the machine's network namespace (`--network host`): it reaches the API server on loopback and
the libvirt hosts on their links, and podman's own bridge network (a private range) is never made. What differs from
a pod, and why: no Service or pod IP (the manager needs none: it only calls out), probes are read once at start.

Host ports: with `--network host` a container port is a port of this machine, so two pods of the same Deployment (two
management clusters side by side) would collide. `port_map` gives a container port another host port the way a
pod's own network namespace would keep them apart: every arg binding `:<containerPort>` is rewritten to
`:<hostPort>`, and the readinessProbe is read on the host port. The container is named after `name` (two API servers
may hold the same Deployment).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import resource
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from devenv.control_plane import LocalControlPlane

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# runc, not crun: Debian 12's crun refuses this machine's hybrid cgroups (hack/build-image.sh says more).
RUNTIME = os.environ.get("CAPI_LIBVIRT_CONTAINER_RUNTIME", "runc")
TOKEN_SECONDS = 3600
DEFAULT_GRACE_S = 30


class PodError(RuntimeError):
    """The container could not be started, was refused, or did not become ready; the message ends with its log."""


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", "--runtime", RUNTIME, *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise PodError(f"podman {' '.join(args[:2])} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result


def ulimit_flags() -> list[str]:
    """The limits the container gets: this process's own hard limits, processes capped at pid_max. podman's defaults
    (a million open files) cannot be set without CAP_SYS_RESOURCE, which this test bed's root lacks."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    pid_max = int(pathlib.Path("/proc/sys/kernel/pid_max").read_text())
    nproc = pid_max if nproc == resource.RLIM_INFINITY or nproc > pid_max else nproc
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def image_user(image: str) -> str:
    """The image's configured user (`USER` of its Dockerfile), as podman records it."""
    return json.loads(podman("image", "inspect", image).stdout)[0]["Config"].get("User", "") or ""


def is_non_root(user: str) -> bool:
    """runAsNonRoot as the kubelet checks it: the image's user must be a numeric, non-zero UID."""
    uid = user.split(":", 1)[0]
    return uid.isdigit() and int(uid) != 0


class PodmanPod:
    """One Deployment's container under podman; a context manager. `folder` holds the ServiceAccount files."""

    def __init__(self, plane: LocalControlPlane, namespace: str, deployment: str, folder: pathlib.Path, *,
                 port_map: Mapping[int, int] | None = None, name: str | None = None) -> None:
        """`port_map`: container port -> host port (see the module's docstring); `name`: the container's name."""
        self.plane = plane
        self.namespace = namespace
        self.deployment_name = deployment
        self.folder = folder
        self.port_map = dict(port_map or {})
        self.name = (name or f"pod-{namespace}-{deployment}")[:63]
        self.deployment: dict[str, Any] = {}
        self.container: dict[str, Any] = {}

    def __enter__(self) -> PodmanPod:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- what the kubelet would read ---------------------------------------------------------------------------------

    @property
    def pod_spec(self) -> dict[str, Any]:
        return self.deployment["spec"]["template"]["spec"]

    @property
    def image(self) -> str:
        return self.container["image"]

    def _read_deployment(self) -> None:
        self.deployment = self.plane.request(
            "GET", f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{self.deployment_name}")
        containers = self.pod_spec["containers"]
        if len(containers) != 1:
            raise PodError(f"{self.namespace}/{self.deployment_name}: {len(containers)} containers; one is supported")
        self.container = containers[0]

    def _service_account_files(self) -> pathlib.Path:
        """token, ca.crt and namespace, readable by the container's non-root user (the folder is the test's own)."""
        account = self.pod_spec.get("serviceAccountName", "default")
        response = self.plane.request(
            "POST", f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": TOKEN_SECONDS}})
        folder = self.folder / "serviceaccount"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        (folder / "token").write_text(response["status"]["token"])
        (folder / "ca.crt").write_bytes(self.plane.ca_file.read_bytes())
        (folder / "namespace").write_text(self.namespace)
        for path in (self.folder, folder, *folder.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        return folder

    def _environment(self) -> list[str]:
        server = urllib.parse.urlsplit(self.plane.server)
        values = {"KUBERNETES_SERVICE_HOST": server.hostname or "", "KUBERNETES_SERVICE_PORT": str(server.port)}
        for variable in self.container.get("env") or []:
            if "value" in variable:  # valueFrom (fieldRef, secretKeyRef) is not needed by the manager
                values[variable["name"]] = variable["value"]
        return [arg for name, value in values.items() for arg in ("--env", f"{name}={value}")]

    # -- the container's life ----------------------------------------------------------------------------------------

    def start(self) -> None:
        self._read_deployment()
        security = {**(self.pod_spec.get("securityContext") or {}), **(self.container.get("securityContext") or {})}
        user = image_user(self.image)
        if security.get("runAsNonRoot") and not is_non_root(user):
            raise PodError(f"image {self.image} runs as {user or 'root'!r}; the pod says runAsNonRoot")
        service_account = self._service_account_files()
        podman("rm", "--force", "--ignore", self.name)
        command = self.container.get("command") or []
        argv = ["run", "--detach", "--name", self.name, "--network", "host", "--pull", "never",
                "--volume", f"{service_account}:{SERVICE_ACCOUNT_DIR}:ro", *ulimit_flags(), *self._environment()]
        if security.get("allowPrivilegeEscalation") is False:
            argv += ["--security-opt", "no-new-privileges"]
        if command:
            argv += ["--entrypoint", command[0]]
        argv += [self.image, *command[1:], *(self.remap(arg) for arg in self.container.get("args") or [])]
        podman(*argv)
        log.info("pod %s/%s: container %s of %s started", self.namespace, self.deployment_name, self.name, self.image)

    def remap(self, arg: str) -> str:
        """`arg` with a trailing `:<containerPort>` of port_map replaced by its host port."""
        head, colon, port = arg.rpartition(":")
        if colon and port.isdigit() and int(port) in self.port_map:
            return f"{head}:{self.port_map[int(port)]}"
        return arg

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until the readinessProbe's URL answers 200 (the container must keep running)."""
        probe = (self.container.get("readinessProbe") or {}).get("httpGet")
        if not probe:
            raise PodError(f"{self.deployment_name}: no httpGet readinessProbe to wait on")
        port = probe["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in self.container.get("ports") or [] if p.get("name") == port)
        url = f"http://127.0.0.1:{self.port_map.get(port, port)}{probe.get('path', '/')}"
        deadline, last = time.monotonic() + timeout, "no answer"
        while time.monotonic() < deadline:
            if not self.running():
                raise PodError(f"container {self.name} exited ({self.exit_code()}):\n{self.logs()[-4000:]}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as error:
                last = f"{error.code} {error.read().decode(errors='replace')[:200]}"
            except OSError as error:
                last = str(error)
            time.sleep(1.0)
        raise PodError(f"container {self.name} not ready at {url} after {timeout:.0f}s ({last}):\n{self.logs()[-4000:]}")

    def running(self) -> bool:
        result = podman("container", "inspect", "--format", "{{.State.Running}}", self.name, check=False)
        return result.stdout.strip() == "true"

    def exit_code(self) -> int | None:
        result = podman("container", "inspect", "--format", "{{.State.ExitCode}}", self.name, check=False)
        return int(result.stdout.strip()) if result.returncode == 0 and result.stdout.strip() else None

    def logs(self) -> str:
        result = podman("logs", self.name, check=False)
        return result.stdout + result.stderr

    def terminate(self) -> int | None:
        """SIGTERM, the pod's grace period, then SIGKILL (as a kubelet deletes a pod); the exit code."""
        grace = int(self.pod_spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))
        podman("stop", "--time", str(grace), self.name, check=False, timeout=grace + 30)
        return self.exit_code()

    def stop(self) -> None:
        """Stop (if running) and remove the container; the ServiceAccount files go too."""
        if self.running():
            self.terminate()
        podman("rm", "--force", "--ignore", self.name, check=False)
        shutil.rmtree(self.folder / "serviceaccount", ignore_errors=True)
