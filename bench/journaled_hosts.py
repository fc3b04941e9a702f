"""In-memory hosts that outlive a SIGKILLed operator: the chaos-at-scale run (bench/scale_chaos.py).

The scale bench's hosts live in the operator's process (bench/memory_operator.py). A graceful stop can save them
(`--state`), a SIGKILL cannot, and a hypervisor keeps what it did whatever happens to its client. So each host change
is written down before the operator hears of it: every host operation that changes something (a volume made or
removed, a domain defined, started, edited or deleted, a lease pinned) is appended, with its arguments, to a journal
on disk the moment it has acted, in the order the operations acted (the event loop runs one at a time and nothing
awaits between the change and the append). An unbuffered O_APPEND write is in the kernel once `write` returns, so a
SIGKILL right after it keeps it, as libvirtd keeps a domain defined by a client that died before the answer came.

At each start the hosts are made again: the last snapshot, then the journal's operations replayed in order (no
latency), then a new snapshot and an empty journal (numbered, so a start killed between the two never replays an
operation twice). Separately, `created.log` gets a line for every domain a define made (not one it found defined
already): the run's proof that no machine's domain was ever defined twice. Bench code, never the product's.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import os
import pathlib
import pickle
from collections.abc import Callable

from capi_libvirt.hypervisor import machines
from devenv.memory_host import MemoryHost

# The Host operations that change a host (devenv.memory_host passes each its arguments in order). Image imports are
# not among them: the scale bench's machines use a base volume the host starts with, and an import is refused.
CHANGING = frozenset({
    "ensure_filters", "ensure_overlay", "ensure_data_disks", "replace_nocloud", "replace_ignition", "ensure_serial_log",
    "define_domain", "start_domain", "pin_leased_addresses", "set_owner", "eject_nocloud", "delete_nocloud",
    "drop_ignition", "delete_machine", "remove_orphan"})


class Journal:
    """A folder: snapshot-<g>.pickle (every host, as of the start of generation g), journal-<g> (what changed since,
    as length-prefixed pickles), created.log (host and UUID of each domain a define made)."""

    def __init__(self, folder: pathlib.Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        self._created: int | None = None

    def generation(self) -> int:
        numbers = [int(path.name.split("-")[1].split(".")[0]) for path in self.folder.glob("snapshot-*.pickle")]
        return max(numbers, default=0)

    def load(self, make: Callable[[str], JournaledHost]) -> dict[str, JournaledHost]:
        """The hosts as the last run left them: the snapshot, then its journal replayed."""
        generation = self.generation()
        hosts: dict[str, JournaledHost] = {}
        snapshot = self.folder / f"snapshot-{generation}.pickle"
        if snapshot.exists():
            for name, (pools, networks, domains) in pickle.loads(snapshot.read_bytes()).items():
                host = hosts[name] = make(name)
                host.pools, host.networks, host.domains = pools, networks, domains
        journal = self.folder / f"journal-{generation}"
        if journal.exists():
            asyncio.run(_replay(journal.read_bytes(), hosts, make))
        return hosts

    def start(self, hosts: dict[str, JournaledHost]) -> None:
        """A new generation: the hosts as they are now, and an empty journal to append to."""
        generation = self.generation() + 1
        snapshot = self.folder / f"snapshot-{generation}.pickle"
        partial = snapshot.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(state_of(hosts)))
        partial.rename(snapshot)  # from here on this generation is the one loaded
        for old in [*self.folder.glob("snapshot-*.pickle"), *self.folder.glob("journal-*")]:
            if old.name not in (snapshot.name, f"journal-{generation}"):
                old.unlink()
        self._fd = os.open(self.folder / f"journal-{generation}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._created = os.open(self.folder / "created.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, host: str, operation: str, args: tuple[object, ...]) -> None:
        if self._fd is None:
            return  # replaying
        record = pickle.dumps((host, operation, args))
        os.write(self._fd, len(record).to_bytes(4, "big") + record)

    def append_raw(self, data: bytes) -> None:
        """Bytes as they are (a test's torn record)."""
        assert self._fd is not None
        os.write(self._fd, data)

    def created(self, host: str, uuid: str) -> None:
        if self._created is not None:
            os.write(self._created, f"{host} {uuid}\n".encode())

    def creations(self) -> list[tuple[str, str]]:
        path = self.folder / "created.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return [(host, uuid) for host, uuid in (line.split() for line in lines if line)]


def state_of(hosts: dict[str, JournaledHost]) -> dict[str, tuple]:
    return {name: (host.pools, host.networks, host.domains) for name, host in hosts.items()}


async def _replay(data: bytes, hosts: dict[str, JournaledHost], make: Callable[[str], JournaledHost]) -> None:
    latencies = {name: host.latency_s for name, host in hosts.items()}
    for host in hosts.values():
        host.latency_s = 0.0  # what was done then, done again at once
    offset = 0
    while offset + 4 <= len(data):
        size = int.from_bytes(data[offset:offset + 4], "big")
        if offset + 4 + size > len(data):
            break  # the last record, cut by the SIGKILL mid-write: that operation's answer never left either
        name, operation, args = pickle.loads(data[offset + 4:offset + 4 + size])
        offset += 4 + size
        if name not in hosts:
            hosts[name] = make(name)
            latencies[name], hosts[name].latency_s = hosts[name].latency_s, 0.0
        try:  # only operations that succeeded were written: each must succeed again, or the state diverged
            await getattr(hosts[name], operation)(*args)
        except Exception as error:
            raise RuntimeError(f"replaying {operation} on host {name} failed: {error!r}") from error
    for name, latency in latencies.items():
        hosts[name].latency_s = latency


class JournaledHost(MemoryHost):
    """A MemoryHost whose changes go to a Journal as they happen (nothing is written while replaying)."""

    journal: Journal | None = None

    @contextlib.asynccontextmanager
    async def _operation(self, name: str, *args: object) -> collections.abc.AsyncIterator[None]:
        if name == "import_image":
            raise NotImplementedError("the chaos-at-scale hosts do not journal image imports")
        existed = name == "define_domain" and args[0] in self.domains
        async with super()._operation(name, *args):
            yield
        if self.journal is not None and name in CHANGING:
            self.journal.append(self.host, name, args)
            if name == "define_domain" and not existed and args[0] in self.domains:
                self.journal.created(self.host, str(args[0]))


def machine_volume_names(volumes: machines.MachineVolumes) -> set[str]:
    """Every volume a machine may have on its host (its overlay, seeds, log, data disks)."""
    return set(volumes.all_names())
