"""The operator as a process of its own (`python -m capi_libvirt run`), started, SIGKILLed and started again from
outside, as a node failure, an OOM kill or a rollout would; every run's output appended to one log."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import sys


class OperatorProcess:
    def __init__(self, kubeconfig: pathlib.Path, hosts: dict[str, str], log_path: pathlib.Path) -> None:
        self.kubeconfig, self.hosts, self.log_path = kubeconfig, hosts, log_path
        self.process: asyncio.subprocess.Process | None = None
        self.starts = self.kills = 0

    async def start(self) -> None:
        assert self.process is None or self.process.returncode is not None, "already running"
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        hosts = [arg for name, uri in self.hosts.items() for arg in ("--host", f"{name}={uri}")]
        with self.log_path.open("ab") as log:
            log.write(f"---- start {self.starts + 1}\n".encode())
            log.flush()
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "capi_libvirt", "run", *hosts, "--standalone", "--log-format", "plain",
                "--health-address", "0", "--metrics-address", "0", env=env, stdout=log, stderr=log,
                stdin=asyncio.subprocess.DEVNULL)
        self.starts += 1

    async def kill(self) -> None:
        """SIGKILL: no handler, no cleanup, no finally runs in the operator."""
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            self.kills += 1
        await self.process.wait()

    async def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM, as a rollout would; SIGKILL when it does not end in time."""
        if self.process is None or self.process.returncode is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()

    @property
    def died_by_itself(self) -> bool:
        """The last run ended with neither our SIGKILL nor our SIGTERM (a crash of its own)."""
        return self.process is not None and self.process.returncode not in (None, -signal.SIGKILL, -signal.SIGTERM)
