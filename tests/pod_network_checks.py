"""The pod network of a whole cluster (tests/e2e/test_whole_cluster.py), proven as Kubernetes' own e2e networking
tests prove it: flannel's DaemonSet Ready on every Node, each Node its own slice of the pod CIDR, and `agnhost
netexec` pods, one pinned to each Node, asked through the workload API server's pod proxy to call each other
(`/dial`): pod to pod across the two nodes both ways, then a ClusterIP Service of the worker's pod by its address
(kube-proxy) and by its DNS name (CoreDNS). Each ask is retried until it answers, and what it read last is the
wait's last-seen state; so is every write (day2_rollouts.workload_write): the workload API server restarts under
TCG load, and a create whose answer was lost counts as made (409). The check's namespace is deleted at the end."""

from __future__ import annotations

import ipaddress
import json

from kubernetes_asyncio import client

from capi_libvirt.api import pod_network, templates
from day2_rollouts import workload_read, workload_write

from waiting import Clock, Pending, wait_until

NAMESPACE = "pod-network-check"
AGNHOST_PORT = 8080
SERVICE = "netexec"
SERVICE_PORT = 80
FLANNEL_PUBLIC_IP = "flannel.alpha.coreos.com/public-ip"  # the Node annotation flanneld writes
DEADLINE_S = 900.0  # image unpacking, flannel's first lease and route, pods started under TCG


def _netexec_pod(name: str, node: str, image: str, side: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace=NAMESPACE, labels={"app": SERVICE, "side": side}),
        spec=client.V1PodSpec(
            node_name=node,  # pinned: one on each Node, the control plane's taint tolerated
            tolerations=[client.V1Toleration(operator="Exists")],
            containers=[client.V1Container(
                name="netexec", image=image, image_pull_policy="Never",
                args=["netexec", f"--http-port={AGNHOST_PORT}"],
                ports=[client.V1ContainerPort(container_port=AGNHOST_PORT)],
                readiness_probe=client.V1Probe(
                    http_get=client.V1HTTPGetAction(path="/healthz", port=AGNHOST_PORT), period_seconds=2))]))


async def _flannel_ready(workload_api: client.ApiClient, nodes: list[str]):
    apps, core = client.AppsV1Api(workload_api), client.CoreV1Api(workload_api)
    daemon_set = await workload_read(apps.read_namespaced_daemon_set(
        "kube-flannel-ds", pod_network.NAMESPACE, _request_timeout=10))
    if isinstance(daemon_set, Pending):
        return daemon_set
    listed = await workload_read(core.list_node(_request_timeout=10))
    if isinstance(listed, Pending):
        return listed
    cidrs = {n.metadata.name: n.spec.pod_cidr for n in listed.items}
    status = daemon_set.status
    if (status.number_ready or 0) < len(nodes) or not all(cidrs.get(n) for n in nodes):
        return Pending(flannel=f"{status.number_ready or 0}/{status.desired_number_scheduled or 0} ready",
                       pod_cidrs=cidrs)
    # The address flanneld announced for VXLAN is the Node's own, never the control-plane endpoint's virtual IP
    # (which moves between machines).
    announced = {n.metadata.name: ((n.metadata.annotations or {}).get(FLANNEL_PUBLIC_IP),
                                   [a.address for a in n.status.addresses or [] if a.type == "InternalIP"])
                 for n in listed.items if n.metadata.name in nodes}
    assert all(public in internal for public, internal in announced.values()), announced
    return cidrs


async def _default_service_account(workload_api: client.ApiClient):
    listed = await workload_read(client.CoreV1Api(workload_api).list_namespaced_service_account(
        NAMESPACE, _request_timeout=10))
    if isinstance(listed, Pending):
        return listed
    return any(account.metadata.name == "default" for account in listed.items) or None


async def _pod_ip(workload_api: client.ApiClient, name: str):
    pod = await workload_read(client.CoreV1Api(workload_api).read_namespaced_pod(name, NAMESPACE,
                                                                                 _request_timeout=10))
    if isinstance(pod, Pending):
        return pod
    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    if not (ready and pod.status.pod_ip):
        return Pending(pod=name, phase=pod.status.phase, ip=pod.status.pod_ip,
                       containers=[(s.name, str(s.state)) for s in pod.status.container_statuses or []])
    return pod.status.pod_ip


async def _dial(workload_api: client.ApiClient, pod: str, host: str, port: int):
    """`/dial` of the netexec pod `pod`, through the API server's pod proxy: it asks host:port for its hostname.
    The answering pod's name, or a Pending naming what came back."""
    query = [("request", "hostname"), ("protocol", "http"), ("host", host), ("port", str(port)), ("tries", "1")]
    response = await workload_read(workload_api.call_api(
        f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}:{AGNHOST_PORT}/proxy/dial", "GET", query_params=query,
        auth_settings=["BearerToken"], _preload_content=False, _request_timeout=20))
    if isinstance(response, Pending):
        return response
    try:
        text = await response.text()
    finally:
        response.release()
    if response.status != 200:
        return Pending(dial=f"{pod} -> {host}:{port}", status=response.status, body=text[:300])
    answer = json.loads(text)
    if answer.get("errors") or not answer.get("responses"):
        return Pending(dial=f"{pod} -> {host}:{port}", answer=answer)
    return answer["responses"][0]


async def prove_the_pod_network(workload_api: client.ApiClient, control_plane_node: str, worker_node: str,
                                clock: Clock) -> dict[str, str]:
    """flannel Ready with a pod CIDR per Node, then the four calls; returns what each call answered."""
    nodes = [control_plane_node, worker_node]
    cidrs = await wait_until("flannel Ready on both Nodes, each with its pod CIDR",
                             lambda: _flannel_ready(workload_api, nodes), DEADLINE_S, interval=3.0)
    clock.mark("flannel Ready on both Nodes (ClusterResourceSet applied)")
    cluster_cidr = ipaddress.ip_network(templates.POD_CIDR)
    slices = [ipaddress.ip_network(cidrs[n]) for n in nodes]
    assert all(s.subnet_of(cluster_cidr) for s in slices) and not slices[0].overlaps(slices[1]), cidrs

    core = client.CoreV1Api(workload_api)
    agnhost = await _agnhost_image(workload_api, control_plane_node)
    assert agnhost, f"the Node {control_plane_node} reports no agnhost image (the node image preloads it)"
    await workload_write(f"the namespace {NAMESPACE} created", lambda: core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)), _request_timeout=20), done_if=(409,))
    # Pods are admitted once the namespace's `default` ServiceAccount exists (kube-controller-manager makes it).
    await wait_until(f"the ServiceAccount {NAMESPACE}/default", lambda: _default_service_account(workload_api),
                     DEADLINE_S, interval=2.0)
    server, caller = "netexec-worker", "netexec-control-plane"
    for name, node, side in ((caller, control_plane_node, "control-plane"), (server, worker_node, "worker")):
        pod = _netexec_pod(name, node, agnhost, side)
        await workload_write(f"the pod {name} created", lambda p=pod: core.create_namespaced_pod(
            NAMESPACE, p, _request_timeout=20), done_if=(409,))
    await workload_write(f"the Service {SERVICE} created", lambda: core.create_namespaced_service(
        NAMESPACE, client.V1Service(
            metadata=client.V1ObjectMeta(name=SERVICE, namespace=NAMESPACE),
            spec=client.V1ServiceSpec(selector={"app": SERVICE, "side": "worker"}, ports=[
                client.V1ServicePort(port=SERVICE_PORT, target_port=AGNHOST_PORT)])), _request_timeout=20),
        done_if=(409,))
    ips = {}
    for name in (caller, server):
        ips[name] = await wait_until(f"the pod {name} Ready with an address", lambda n=name: _pod_ip(workload_api, n),
                                     DEADLINE_S, interval=3.0)
        assert any(ipaddress.ip_address(ips[name]) in s for s in slices), (name, ips[name], cidrs)
    service = await wait_until(f"the Service {SERVICE} read", lambda: workload_read(
        core.read_namespaced_service(SERVICE, NAMESPACE, _request_timeout=20)), DEADLINE_S, interval=3.0)
    calls = {
        f"{caller} -> {server} ({ips[server]}, the other Node)": (caller, ips[server], AGNHOST_PORT, server),
        f"{server} -> {caller} ({ips[caller]}, the other Node)": (server, ips[caller], AGNHOST_PORT, caller),
        f"{caller} -> Service {SERVICE} ({service.spec.cluster_ip}, kube-proxy)":
            (caller, service.spec.cluster_ip, SERVICE_PORT, server),
        f"{caller} -> {SERVICE}.{NAMESPACE}.svc.cluster.local (CoreDNS, kube-proxy)":
            (caller, f"{SERVICE}.{NAMESPACE}.svc.cluster.local", SERVICE_PORT, server),
    }
    answers = {}
    for what, (pod, host, port, expected) in calls.items():
        answers[what] = await wait_until(what, lambda p=pod, h=host, o=port: _dial(workload_api, p, h, o),
                                         DEADLINE_S, interval=3.0)
        assert answers[what] == expected, (what, answers[what])
        clock.mark(f"answered: {what}")
    # Gone before the day-2 rollouts: a drain would wait on Pods no controller owns.
    await workload_write(f"the namespace {NAMESPACE} deleted", lambda: core.delete_namespace(
        NAMESPACE, grace_period_seconds=0, _request_timeout=20), done_if=(404,))
    return answers


async def _agnhost_image(workload_api: client.ApiClient, node: str) -> str | None:
    """The agnhost image the Node's container runtime holds (the node image preloads it), from the Node's status."""
    found = await wait_until(f"the Node {node} read", lambda: workload_read(
        client.CoreV1Api(workload_api).read_node(node, _request_timeout=20)), DEADLINE_S, interval=3.0)
    names = [name for image in found.status.images or [] for name in image.names or []]
    return next((n for n in names if "/agnhost:" in n), None)
