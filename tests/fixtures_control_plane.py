"""Fixtures of the real Kubernetes API: one etcd + kube-apiserver for the session, and async clients to it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import os
import pathlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import kopf
import pytest
import yaml
from kubernetes_asyncio import client, config

from capi_libvirt.api import meta
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
OPERATOR_SUBJECT = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}
AUTOSCALER_USER = "e2e-cluster-autoscaler"  # bound only to config/autoscaler's roles (tests/e2e/test_autoscaler.py)
# The provider's namespace: LibvirtHost credentials Secrets must live here (the operator refuses them elsewhere).
PROVIDER_NAMESPACE = meta.PROVIDER_NAMESPACE


def bind_operator_role(plane: cp.LocalControlPlane) -> None:
    """The operator in tests runs as a user bound ONLY to what config/rbac ships: the ClusterRole (role.yaml) by a
    ClusterRoleBinding, the Secrets ClusterRole (secrets_role.yaml) by a RoleBinding in the provider's namespace
    only, as secrets_role_binding.yaml binds it, and the leader election Role there (leader_election_role.yaml). A missing rule fails the tests; a namespace whose Secrets the operator
    must read gets its RoleBinding from `allow_secrets`, the documented way."""
    rbac = REPO / "config" / "rbac"
    plane.grant(yaml.safe_load((rbac / "role.yaml").read_text()), OPERATOR_USER)
    plane.apply("/apis/rbac.authorization.k8s.io/v1/clusterroles", yaml.safe_load((rbac / "secrets_role.yaml").read_text()))
    plane.ensure_namespace(PROVIDER_NAMESPACE)
    allow_secrets(plane, PROVIDER_NAMESPACE)
    plane.grant(yaml.safe_load((rbac / "leader_election_role.yaml").read_text()), OPERATOR_USER)  # the Lease


def allow_secrets(plane: cp.LocalControlPlane, namespace: str) -> None:
    """What a user does for each namespace whose machines the provider serves (the cluster templates carry it for the
    ServiceAccount): a RoleBinding there of the Secrets ClusterRole, here to the tests' operator user."""
    plane.bind_in_namespace(meta.SECRETS_CLUSTER_ROLE, namespace, OPERATOR_SUBJECT)


@pytest.fixture(scope="session")
async def api_client(control_plane: cp.LocalControlPlane) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(control_plane.kubeconfig_path), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        yield api


@pytest.fixture
async def namespace(api_client: client.ApiClient, control_plane: cp.LocalControlPlane) -> AsyncIterator[str]:
    """A fresh namespace per test, whose Secrets the operator may read (allow_secrets), deleted afterwards."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    allow_secrets(control_plane, name)
    yield name
    await core.delete_namespace(name)


@pytest.fixture
def plain_namespace(control_plane: cp.LocalControlPlane) -> Iterator[str]:
    """A fresh namespace for tests that use the control plane's own minimal client (no event loop), deleted after."""
    name = f"plain-{uuid.uuid4().hex[:8]}"
    control_plane.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": name}})
    allow_secrets(control_plane, name)
    yield name
    control_plane.request("DELETE", f"/api/v1/namespaces/{name}")


@contextlib.asynccontextmanager
async def operator_running(control_plane: cp.LocalControlPlane, hosts: dict[str, str],
                           config: operator_config.OperatorConfig | None = None,
                           **settings: Any) -> AsyncIterator[kopf.Memo]:
    """The operator itself, in the test's event loop, against the test API server and the given libvirt hosts
    (or with `config`, which then names the hosts itself); `settings` are more of its OperatorConfig
    (probe_interval_s, replace_after_s, ...), set over `config` when both are given.

    Yields the operator's memo: `memo.runtime.deps` holds its API and host connections (and their call counters).
    It authenticates as OPERATOR_USER, whose only rights are the ClusterRole the project ships.
    """
    os.environ["KUBECONFIG"] = str(control_plane.kubeconfig_for(OPERATOR_USER))
    stop, memo = asyncio.Event(), kopf.Memo()
    config = config if config is not None else operator_config.OperatorConfig(hosts=hosts)
    if settings:
        config = dataclasses.replace(config, **settings)
    task = asyncio.create_task(main.run_operator(operator_config=config,
                                                 stop_flag=stop, memo=memo))
    try:
        yield memo
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):  # kopf ends its root task by cancelling it
            await asyncio.wait_for(task, timeout=60)
        assert task.done()


@pytest.fixture(scope="module")
async def running_operator(control_plane: cp.LocalControlPlane) -> AsyncIterator[None]:
    """The operator with no libvirt host: for what needs only the API server. For the module that asks for it only: an
    operator left running for the rest of the worker's session would reconcile the next modules' LibvirtMachines too
    and, knowing none of their hosts, mark them `HostUnreachable` ("not a configured host") beside their own
    operator (seen in test_machine_lifecycle, cold run at 9d6961c)."""
    async with operator_running(control_plane, hosts={}):
        yield
