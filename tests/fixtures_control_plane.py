"""Fixtures of the real Kubernetes API: one etcd + kube-apiserver for the session, and async clients to it."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import pathlib
import uuid
from collections.abc import AsyncIterator, Iterator

import kopf
import pytest
import yaml
from kubernetes_asyncio import client, config

from capi_libvirt.operator import config as operator_config
from capi_libvirt.operator import main
from devenv import control_plane as cp
from devenv import paths

from fixtures_libvirt import SESSION_SUBNET
from prereq import require

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cp.LocalControlPlane]:
    require(paths.etcd_binary().exists(), f"etcd binary {paths.etcd_binary()} (make upstream)")
    require(paths.kube_apiserver_binary().exists(), f"kube-apiserver binary {paths.kube_apiserver_binary()} (make upstream)")
    require(paths.kubeadm_binary().exists(), f"kubeadm binary {paths.kubeadm_binary()} (make upstream)")
    require(paths.cluster_api_crd_dir().is_dir(), f"Cluster API CRDs {paths.cluster_api_crd_dir()} (make upstream)")
    plane = cp.LocalControlPlane(
        workdir=tmp_path_factory.mktemp("control-plane"),
        crd_dirs=[REPO / "config" / "crd", paths.cluster_api_crd_dir()],
        users=[OPERATOR_USER, AUTOSCALER_USER],
        # The session libvirt host's bridge, where its guests reach the API server through an API gateway.
        serving_addresses=[str(ipaddress.ip_network(SESSION_SUBNET)[1])],
    )
    with plane:
        bind_operator_role(plane)
        yield plane


OPERATOR_USER = "capi-libvirt-operator"
AUTOSCALER_USER = "e2e-cluster-autoscaler"  # bound only to config/autoscaler's roles (tests/e2e/test_autoscaler.py)


def bind_operator_role(plane: cp.LocalControlPlane) -> None:
    """The operator in tests runs as a user bound ONLY to config/rbac/role.yaml: a missing rule fails the tests."""
    plane.grant(yaml.safe_load((REPO / "config" / "rbac" / "role.yaml").read_text()), OPERATOR_USER)


@pytest.fixture(scope="session")
async def api_client(control_plane: cp.LocalControlPlane) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(control_plane.kubeconfig_path), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        yield api


@pytest.fixture
async def namespace(api_client: client.ApiClient) -> AsyncIterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    await core.delete_namespace(name)


@pytest.fixture
def plain_namespace(control_plane: cp.LocalControlPlane) -> Iterator[str]:
    """A fresh namespace for tests that use the control plane's own minimal client (no event loop), deleted after."""
    name = f"plain-{uuid.uuid4().hex[:8]}"
    control_plane.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": name}})
    yield name
    control_plane.request("DELETE", f"/api/v1/namespaces/{name}")


@contextlib.asynccontextmanager
async def operator_running(control_plane: cp.LocalControlPlane, hosts: dict[str, str],
                           **settings: float) -> AsyncIterator[kopf.Memo]:
    """The operator itself, in the test's event loop, against the test API server and the given libvirt hosts;
    `settings` are more of its OperatorConfig (probe_interval_s, replace_after_s).

    Yields the operator's memo: `memo.runtime.deps` holds its API and host connections (and their call counters).
    It authenticates as OPERATOR_USER, whose only rights are the ClusterRole the project ships.
    """
    os.environ["KUBECONFIG"] = str(control_plane.kubeconfig_for(OPERATOR_USER))
    stop, memo = asyncio.Event(), kopf.Memo()
    task = asyncio.create_task(main.run_operator(operator_config=operator_config.OperatorConfig(hosts=hosts, **settings),
                                                 stop_flag=stop, memo=memo))
    try:
        yield memo
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):  # kopf ends its root task by cancelling it
            await asyncio.wait_for(task, timeout=60)
        assert task.done()


@pytest.fixture(scope="session")
async def running_operator(control_plane: cp.LocalControlPlane) -> AsyncIterator[None]:
    """The operator with no libvirt host: for what needs only the API server."""
    async with operator_running(control_plane, hosts={}):
        yield
