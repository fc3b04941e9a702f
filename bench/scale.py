"""The scale bench (`make bench-scale`, `python -m bench.scale`): the real operator process and a real kube-apiserver,
N LibvirtMachines over H in-memory hosts (bench/memory_operator.py: devenv.memory_host, each libvirt call a fixed
latency), for sizes TCG guests cannot reach here.

For each (H, N), on a fresh API server: the N machines are created as Cluster API makes them (bootstrap Secret,
Machine, LibvirtMachine), spread over the H hosts by placement; all provisioned (an address in status, from the
in-memory network's lease); the operator idles over them; all deleted and gone. Measured: time to all provisioned and
to all deleted, each machine's latency from creation to provisioned (p50, p99), the operator's CPU and RSS, its API
requests by kind (the bench's own taken out), the watch events it took in, its host operations, the deepest its work queue got, its idle CPU and
requests with all N provisioned, and a restart over all N (stopped as a rollout stops it, started again: until it has
passed over every machine; its time, CPU and API requests). Per-machine figures are what "cost stays flat as the fleet grows" is judged on.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

from kubernetes_asyncio import client, config, watch

from bench import measure, testbed
from bench.memory_operator import BASE_VOLUME, NETWORK
from capi_libvirt.api import meta
from devenv import control_plane, paths

log = logging.getLogger("bench")
NAMESPACE, CLUSTER = "scale", "scale"
CONCURRENT_WRITES = 32  # the bench's own creates and deletes in flight at once
SPEC = {"image": {"volume": BASE_VOLUME}, "storagePool": "default", "domainType": "qemu", "machineType": "pc",
        "cpus": 1, "memoryMiB": 128, "diskGiB": 1, "interfaces": [{"network": NETWORK}]}


@dataclasses.dataclass(frozen=True)
class Settings:
    machines: tuple[int, ...] = (100, 500, 2000)
    hosts: tuple[int, ...] = (1, 10, 100)
    latency_s: float = 0.005  # a libvirt call's round trip over qemu+tls on a LAN, about what `make bench` sees
    idle_s: float = 60.0
    out: pathlib.Path = pathlib.Path("bench/results")
    name: str = "scale"


class Bed:
    """A fresh API server and the operator over `hosts` in-memory hosts."""

    def __init__(self, workdir: pathlib.Path, hosts: int, latency_s: float, journal: bool = False) -> None:
        """`journal`: the hosts write each change down as it happens and outlive a SIGKILL (bench/journaled_hosts.py);
        else they are saved when the operator stops gracefully."""
        self.workdir, self.hosts, self.latency_s = workdir, hosts, latency_s
        self.host_args = ["--journal", str(workdir / "hosts")] if journal else \
            ["--state", str(workdir / "hosts.pickle")]
        self.plane: control_plane.LocalControlPlane | None = None
        self.operator: subprocess.Popen | None = None
        self.metrics_port = control_plane.free_port()

    @contextlib.contextmanager
    def up(self, start: bool = True) -> Iterator[Bed]:
        """The API server with the bench's namespace and Cluster; the operator too unless `start` is False."""
        with contextlib.ExitStack() as stack:
            (self.workdir / "control-plane").mkdir(parents=True, exist_ok=True)
            self.plane = stack.enter_context(control_plane.LocalControlPlane(
                workdir=self.workdir / "control-plane",
                crd_dirs=[testbed.REPO / "config" / "crd", paths.cluster_api_crd_dir()]))
            self.plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            clusters = f"/apis/{meta.CAPI_GROUP}/{meta.CAPI_VERSION}/namespaces/{NAMESPACE}/clusters"
            self.plane.request("POST", clusters, {
                "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Cluster", "metadata": {"name": CLUSTER},
                "spec": {"infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtCluster", "name": CLUSTER}}})
            self.plane.request("PATCH", f"{clusters}/{CLUSTER}/status",
                               {"status": {"initialization": {"infrastructureProvisioned": True}}},
                               content_type="application/merge-patch+json")
            stack.callback(self.stop_operator)
            if start:
                self.start_operator()
            yield self

    def host_names(self) -> list[str]:
        return [f"mem{index}" for index in range(self.hosts)]

    def start_operator(self) -> None:
        """Started, and until it reached every host."""
        self.spawn_operator()
        assert self.operator is not None
        deadline = time.monotonic() + 120
        while True:
            text = self.operator_metrics()
            if all(f'capi_libvirt_host_reachable{{host="{name}"}} 1.0' in text for name in self.host_names()):
                return
            if self.operator.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the operator did not start or reach its hosts; see {self.workdir / 'operator.log'}")
            time.sleep(0.5)

    def spawn_operator(self) -> None:
        assert self.plane is not None
        output = (self.workdir / "operator.log").open("ab")
        hosts = [f"--host={name}=memory:///{name}" for name in self.host_names()]
        self.operator = subprocess.Popen(
            [sys.executable, "-m", "bench.as_shipped", "bench.memory_operator", "--latency", str(self.latency_s),
             *self.host_args, "--", "--standalone",
             "--log-format", "plain", "--health-address", "0", "--metrics-address", f"127.0.0.1:{self.metrics_port}",
             *hosts], env=dict(os.environ, KUBECONFIG=str(self.plane.kubeconfig_path)), stdout=output,
            stderr=subprocess.STDOUT, cwd=testbed.REPO)

    def stop_operator(self) -> None:
        testbed.stop_operator(self.operator)
        self.operator = None

    def operator_metrics(self) -> str:
        return testbed.operator_metrics(self.metrics_port)

    def apiserver_metrics(self) -> str:
        assert self.plane is not None
        return self.plane.request("GET", "/metrics", accept="text/plain")


def operator_counts(metrics_text: str) -> tuple[float, float]:
    """The operator's host operations and watch events so far."""
    return measure.operator_operations(metrics_text), measure.watch_events(metrics_text)


def queue_depth(metrics_text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines()
               if line.startswith("workqueue_depth{"))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Round:
    """One (H, N): create, all provisioned, idle, delete, all gone; what it cost the operator."""

    def __init__(self, bed: Bed) -> None:
        self.bed = bed
        self.own: dict[measure.Key, int] = {}
        self.created: dict[str, float] = {}
        self.provisioned: dict[str, float] = {}
        self.host_of: dict[str, str] = {}  # the host each machine was placed on
        self.gone: set[str] = set()
        self.changed = asyncio.Event()

    def _count(self, verb: str, resource: str) -> None:
        self.own[(verb, resource)] = self.own.get((verb, resource), 0) + 1

    async def run(self, n: int, idle_s: float) -> dict:
        assert self.bed.plane is not None and self.bed.operator is not None
        configuration = client.Configuration()
        await config.load_kube_config(config_file=str(self.bed.plane.kubeconfig_path),
                                      client_configuration=configuration)
        pid = self.bed.operator.pid
        async with client.ApiClient(configuration) as api:
            objects = client.CustomObjectsApi(api)
            listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, NAMESPACE,
                                                                 "libvirtmachines")
            self._count("LIST", "libvirtmachines")
            watching = asyncio.create_task(self._watch(objects, listed["metadata"]["resourceVersion"]))
            depths: list[float] = []
            sampling = asyncio.create_task(self._sample_depth(depths))
            try:
                api_before = measure.api_requests(await asyncio.to_thread(self.bed.apiserver_metrics))
                ops_before, events_before = operator_counts(await asyncio.to_thread(self.bed.operator_metrics))
                cpu_before = measure.process_sample(pid)
                started = time.monotonic()
                await self._all(n, lambda name: self._create(api, name))
                await self._until(lambda: len(self.provisioned) >= n, 120 + 2.0 * n, "provisioned")
                provisioned_s = time.monotonic() - started
                after_provisioning = measure.process_sample(pid)
                idle_api_before = measure.api_requests(await asyncio.to_thread(self.bed.apiserver_metrics))
                await asyncio.sleep(idle_s)
                idle_sample = measure.process_sample(pid)
                idle_api_after = measure.api_requests(await asyncio.to_thread(self.bed.apiserver_metrics))
                idle_api = measure.difference(idle_api_after, idle_api_before, {})
                ops_before_restart, events_before_restart = operator_counts(
                    await asyncio.to_thread(self.bed.operator_metrics))
                restart = await self._restart(n)
                pid = self.bed.operator.pid
                restart_api = measure.difference(
                    measure.api_requests(await asyncio.to_thread(self.bed.apiserver_metrics)), idle_api_after, {})
                ops_after_restart, events_after_restart = operator_counts(
                    await asyncio.to_thread(self.bed.operator_metrics))
                before_deleting = measure.process_sample(pid)
                deleting = time.monotonic()
                await self._all(n, lambda name: self._delete(objects, name))
                try:
                    await self._until(lambda: len(self.gone) >= n, 120 + 2.0 * n, "gone")
                except TimeoutError as error:
                    raise TimeoutError(f"{error}; those left: {await self._left(objects)}") from None
                deleted_s = time.monotonic() - deleting
                cpu_after = measure.process_sample(pid)
                ops_after, events_after = operator_counts(await asyncio.to_thread(self.bed.operator_metrics))
                api_after = measure.api_requests(await asyncio.to_thread(self.bed.apiserver_metrics))
            finally:
                watching.cancel()
                sampling.cancel()
            await self._remove_the_rest(api, n)
        lifecycle = measure.split(measure.difference(api_after, api_before, self.own))
        idle_totals, restart_totals = measure.split(idle_api), measure.split(restart_api)
        for key in lifecycle:  # the idle stretch and the restart are not a machine's lifecycle
            lifecycle[key] -= idle_totals[key] + restart_totals[key]
        latencies = [self.provisioned[name] - self.created[name] for name in self.provisioned]
        # Two processes: the first provisioned the machines, the one after the restart deleted them.
        lifecycle_cpu = (after_provisioning.cpu_s - cpu_before.cpu_s) + (cpu_after.cpu_s - before_deleting.cpu_s)
        host_operations = (ops_before_restart - ops_before) + (ops_after - ops_after_restart)
        # The restarted process counts from 0: its listing of every machine is the restart's, not a lifecycle's.
        lifecycle_events = (events_before_restart - events_before) + (events_after - events_after_restart)
        return {
            "machines": n, "hosts": self.bed.hosts, "latency_s": self.bed.latency_s,
            "provisioned_s": provisioned_s, "deleted_s": deleted_s,
            "latency_p50_s": percentile(latencies, 0.5), "latency_p99_s": percentile(latencies, 0.99),
            "latency_mean_s": statistics.fmean(latencies),
            "cpu_s_per_machine": lifecycle_cpu / n, "rss_mb": after_provisioning.rss_mb,
            "api_per_machine": {key: value / n for key, value in lifecycle.items()},
            "host_operations_per_machine": host_operations / n,
            "watch_events_per_machine": lifecycle_events / n,
            "max_queue_depth": max(depths, default=0.0),
            "queue_depth_each_second": depths,  # from the first create to the last machine gone, restart included
            "machines_per_host": dict(sorted(collections.Counter(self.host_of.values()).items())),
            "idle": {"seconds": idle_s, "cpu_percent_of_core": 100 * (idle_sample.cpu_s - after_provisioning.cpu_s)
                     / idle_s, "api": idle_totals},
            "restart": {**restart, "watch_events": events_after_restart, "api": restart_totals, "api_by_request": {
                f"{verb} {resource}": count for (verb, resource), count in sorted(restart_api.items())}},
        }

    async def _restart(self, n: int) -> dict:
        """The operator stopped as a Deployment's rollout stops it (SIGTERM; the hosts keep what they hold) and
        started again: until its hosts answer, then until it has passed over every machine once (the start queues
        them all) and its queue is empty. What that took, in time and in the new process's CPU."""
        stopped = time.monotonic()
        await asyncio.to_thread(self.bed.stop_operator)
        await asyncio.to_thread(self.bed.start_operator)
        assert self.bed.operator is not None
        hosts_s = time.monotonic() - stopped

        def confirmed() -> bool:
            text = self.bed.operator_metrics()
            passes = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                         if line.startswith('capi_libvirt_reconciles_total{kind="LibvirtMachine"'))
            return passes >= n and queue_depth(text) == 0

        deadline = time.monotonic() + 120 + 0.5 * n
        while not await asyncio.to_thread(confirmed):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the restarted operator did not pass over all {n} machines; see "
                                   f"{self.bed.workdir / 'operator.log'}")
            await asyncio.sleep(0.5)
        sample = measure.process_sample(self.bed.operator.pid)
        return {"hosts_answer_s": hosts_s, "all_confirmed_s": time.monotonic() - stopped,
                "cpu_s": sample.cpu_s, "rss_mb": sample.rss_mb}

    async def _left(self, objects: client.CustomObjectsApi) -> list[dict]:
        """The LibvirtMachines not gone: their finalizers, deletion and conditions as the API server has them."""
        listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, NAMESPACE, "libvirtmachines")
        return [{"name": body["metadata"]["name"], "finalizers": body["metadata"].get("finalizers"),
                 "deletionTimestamp": body["metadata"].get("deletionTimestamp"),
                 "conditions": [(c["type"], c["status"], c.get("reason"), c.get("message"))
                                for c in (body.get("status") or {}).get("conditions") or []]}
                for body in listed["items"]][:10]

    async def _all(self, n: int, do) -> None:
        slots = asyncio.Semaphore(CONCURRENT_WRITES)

        async def one(index: int) -> None:
            async with slots:
                await do(f"m{index}")
        await asyncio.gather(*(one(index) for index in range(n)))

    async def _until(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            self.changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"not all {what} within {timeout:.0f}s: {len(self.provisioned)} provisioned, "
                                   f"{len(self.gone)} gone; see {self.bed.workdir / 'operator.log'}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)

    async def _sample_depth(self, depths: list[float]) -> None:
        while True:
            depths.append(queue_depth(await asyncio.to_thread(self.bed.operator_metrics)))
            await asyncio.sleep(1.0)

    async def _create(self, api: client.ApiClient, name: str) -> None:
        core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
        labels = {meta.CLUSTER_NAME_LABEL: CLUSTER}
        await core.create_namespaced_secret(NAMESPACE, client.V1Secret(
            metadata=client.V1ObjectMeta(name=name, labels=labels), type="cluster.x-k8s.io/secret",
            data={"value": base64.b64encode(b"#cloud-config\n{}\n").decode(),
                  "format": base64.b64encode(b"cloud-config").decode()}))
        machine = await objects.create_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, NAMESPACE,
                                                                "machines", {
            "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Machine",
            "metadata": {"name": name, "labels": labels},
            "spec": {"clusterName": CLUSTER, "bootstrap": {"dataSecretName": name},
                     "infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtMachine", "name": name}}})
        self.created[name] = time.monotonic()
        await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, NAMESPACE, "libvirtmachines", {
            "apiVersion": meta.API_VERSION, "kind": "LibvirtMachine",
            "metadata": {"name": name, "labels": labels, "ownerReferences": [{
                "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Machine", "name": name,
                "uid": machine["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": SPEC})
        for resource in ("secrets", "machines", "libvirtmachines"):
            self._count("POST", resource)

    async def _delete(self, objects: client.CustomObjectsApi, name: str) -> None:
        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, NAMESPACE, "libvirtmachines", name)
        self._count("DELETE", "libvirtmachines")

    async def _watch(self, objects: client.CustomObjectsApi, resource_version: str) -> None:
        while True:
            self._count("WATCH", "libvirtmachines")
            stream = watch.Watch().stream(objects.list_namespaced_custom_object, meta.GROUP, meta.VERSION, NAMESPACE,
                                          "libvirtmachines", resource_version=resource_version, timeout_seconds=3600)
            async for event in stream:
                body = event["object"]
                resource_version = body["metadata"]["resourceVersion"]
                name = body["metadata"]["name"]
                if event["type"] == "DELETED":
                    self.gone.add(name)
                elif (body.get("status") or {}).get("initialization", {}).get("provisioned"):
                    self.provisioned.setdefault(name, time.monotonic())
                    self.host_of[name] = body["status"].get("host", "")
                self.changed.set()

    async def _remove_the_rest(self, api: client.ApiClient, n: int) -> None:
        """The Machines and Secrets (no Cluster API controller here to collect them), after the measurement."""
        core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)

        async def remove(name: str) -> None:
            await objects.delete_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, NAMESPACE, "machines",
                                                          name)
            await core.delete_namespaced_secret(name, NAMESPACE)
        await self._all(n, remove)


def run(settings: Settings) -> dict:
    workdir = testbed.new_workdir()
    log.info("bench-scale: working in %s", workdir)
    runs: list[dict] = []
    results = write(settings, runs)
    for hosts in settings.hosts:
        for machines in settings.machines:
            with Bed(workdir / f"h{hosts}-n{machines}", hosts, settings.latency_s).up() as bed:
                result = asyncio.run(Round(bed).run(machines, settings.idle_s))
            log.info("bench-scale: H=%d N=%d: provisioned in %.1fs (p50 %.2fs, p99 %.2fs), deleted in %.1fs; "
                     "%.3f CPU s and %.1f API writes a machine; RSS %.0f MB; idle %.2f%% of a core", hosts, machines,
                     result["provisioned_s"], result["latency_p50_s"], result["latency_p99_s"], result["deleted_s"],
                     result["cpu_s_per_machine"], result["api_per_machine"]["writes"], result["rss_mb"],
                     result["idle"]["cpu_percent_of_core"])
            runs.append(result)
            results = write(settings, runs)  # after each round: a later round that fails keeps the earlier ones
    return results


def write(settings: Settings, runs: list[dict]) -> dict:
    results = {"settings": {key: (str(value) if isinstance(value, pathlib.Path) else value)
                            for key, value in dataclasses.asdict(settings).items()}, "runs": runs}
    settings.out.mkdir(parents=True, exist_ok=True)
    (settings.out / f"{settings.name}.json").write_text(json.dumps(results, indent=1) + "\n")
    (settings.out / f"{settings.name}.md").write_text(table(runs) + targets(runs))
    if runs:
        plot(runs, settings.out / f"{settings.name}.png")
    return results


def operator_restart_writes(run: dict) -> float:
    """The restart's writes, counted from its requests as measure.split counts them now (kube-apiserver's own Leases
    apart)."""
    return measure.split({tuple(request.split(" ", 1)): count
                          for request, count in run["restart"]["api_by_request"].items()})["writes"]


def targets(runs: list[dict]) -> str:
    """Issue 28's targets, judged for each H from its smallest and largest N (the figures, met or not)."""
    lines = ["", "| hosts | target | measured | met |", "|---|---|---|---|"]
    for hosts in sorted({r["hosts"] for r in runs}):
        mine = sorted((r for r in runs if r["hosts"] == hosts), key=lambda r: r["machines"])
        small, large = mine[0], mine[-1]
        if large["machines"] > small["machines"]:
            cpu = large["cpu_s_per_machine"] / small["cpu_s_per_machine"]
            api = max(large["api_per_machine"][k] / max(small["api_per_machine"][k], 1e-9) for k in ("writes", "reads"))
            growth = (large["rss_mb"] - small["rss_mb"]) / (large["machines"] - small["machines"]) * 1000
            lines += [f"| {hosts} | CPU a machine at N = {large['machines']} within 1.2x of N = {small['machines']} | "
                      f"{cpu:.2f}x | {'yes' if cpu <= 1.2 else 'no'} |",
                      f"| {hosts} | API writes and reads a machine within 1.2x | {api:.2f}x | {'yes' if api <= 1.2 else 'no'} |",
                      f"| {hosts} | RSS growth at most 30 MB per 1,000 machines | {growth:.0f} MB | "
                      f"{'yes' if growth <= 30 else 'no'} |"]
        idle = large["idle"]["cpu_percent_of_core"]
        restart_writes = operator_restart_writes(large)
        lines += [f"| {hosts} | idle at most 2% of a core at N = {large['machines']} ({large['idle']['seconds']:.0f} s) | "
                  f"{idle:.2f}% | {'yes' if idle <= 2 else 'no'} |",
                  f"| {hosts} | a restart at N = {large['machines']} writes nothing | {restart_writes:.0f} writes, "
                  f"{large['restart']['all_confirmed_s']:.1f} s | {'yes' if restart_writes == 0 else 'no'} |",
                  f"| {hosts} | at most 4 API writes a machine | {large['api_per_machine']['writes']:.2f} | "
                  f"{'yes' if large['api_per_machine']['writes'] <= 4 else 'no'} |"]
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: pathlib.Path) -> None:
    """Per-machine cost against N, a line per H: CPU seconds a machine, API writes a machine, and the RSS; and the
    work queue's depth over time at the largest N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (*axes, queue) = plt.subplots(1, 4, figsize=(17, 4))
    for hosts in sorted({r["hosts"] for r in runs}):
        mine = sorted((r for r in runs if r["hosts"] == hosts), key=lambda r: r["machines"])
        xs = [r["machines"] for r in mine]
        for axis, values in zip(axes, ([r["cpu_s_per_machine"] for r in mine],
                                       [r["api_per_machine"]["writes"] for r in mine], [r["rss_mb"] for r in mine]),
                                strict=True):
            axis.plot(xs, values, "o-", label=f"{hosts} host{'s' if hosts > 1 else ''}")
    for axis, label in zip(axes, ("operator CPU s a machine's life", "API writes a machine's life", "operator RSS MB"),
                           strict=True):
        axis.set_xscale("log")
        axis.set_xlabel("machines (N)")
        axis.set_ylabel(label)
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        axis.legend()
    largest = max(r["machines"] for r in runs)
    for r in sorted((r for r in runs if r["machines"] == largest), key=lambda r: r["hosts"]):
        depths = r.get("queue_depth_each_second") or []
        queue.plot(range(len(depths)), depths, label=f"{r['hosts']} host{'s' if r['hosts'] > 1 else ''}")
    queue.set_xlabel(f"seconds from the first create (N = {largest})")
    queue.set_ylabel("work queue depth")
    queue.grid(True, alpha=0.3)
    queue.legend()
    figure.suptitle("capi-libvirt make bench-scale: cost per machine as the fleet grows")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def table(runs: list[dict]) -> str:
    lines = ["| hosts | machines | all provisioned s | p50 s | p99 s | all deleted s | CPU s / machine | API writes / "
             "machine | API reads / machine | events / machine | watch events / machine | host ops / machine | RSS MB | max queue | idle % core | "
             "restart: all confirmed s | restart: CPU s | restart: API writes | restart: API reads |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        api = r["api_per_machine"]
        lines.append(f"| {r['hosts']} | {r['machines']} | {r['provisioned_s']:.1f} | {r['latency_p50_s']:.2f} | "
                     f"{r['latency_p99_s']:.2f} | {r['deleted_s']:.1f} | {r['cpu_s_per_machine']:.3f} | "
                     f"{api['writes']:.2f} | {api['reads']:.2f} | {api['events']:.2f} | "
                     f"{r.get('watch_events_per_machine', float('nan')):.1f} | "
                     f"{r['host_operations_per_machine']:.1f} | {r['rss_mb']:.0f} | {r['max_queue_depth']:.0f} | "
                     f"{r['idle']['cpu_percent_of_core']:.2f} | {r['restart']['all_confirmed_s']:.1f} | "
                     f"{r['restart']['cpu_s']:.1f} | {operator_restart_writes(r):.0f} | "
                     f"{r['restart']['api']['reads']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    def counts(value: str) -> tuple[int, ...]:
        return tuple(int(part) for part in value.split(","))
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--machines", type=counts, default=Settings.machines, help="N, comma-separated")
    parser.add_argument("--hosts", type=counts, default=Settings.hosts, help="H, comma-separated")
    parser.add_argument("--latency", type=float, default=Settings.latency_s, help="seconds a host operation takes")
    parser.add_argument("--idle-seconds", type=float, default=Settings.idle_s)
    parser.add_argument("--out", type=pathlib.Path, default=Settings.out)
    parser.add_argument("--name", default=Settings.name)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    run(Settings(machines=args.machines, hosts=args.hosts, latency_s=args.latency, idle_s=args.idle_seconds,
                 out=args.out, name=args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
