"""The operator as a process of its own (`python -m capi_libvirt run`), started, SIGKILLed and started again from
outside, as a node failure, an OOM kill or a rollout would; every run's output appended to one log."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import sys
import time


class OperatorProcess:
    def __init__(self, kubeconfig: pathlib.Path, hosts: dict[str, str], log_path: pathlib.Path) -> None:
        self.kubeconfig, self.hosts, self.log_path = kubeconfig, hosts, log_path
        self.process: asyncio.subprocess.Process | None = None
        self._run_offset = 0
        self.starts = self.kills = 0
        self.exits_of_its_own: list[int] = []  # return codes of runs that ended before we killed or stopped them

    async def start(self) -> None:
        assert self.process is None or self.process.returncode is not None, "already running"
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        hosts = [arg for name, uri in self.hosts.items() for arg in ("--host", f"{name}={uri}")]
        with self.log_path.open("ab") as log:
            log.write(f"---- start {self.starts + 1} at {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            self._run_offset = log.tell()
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "capi_libvirt", "run", *hosts, "--standalone", "--log-format", "plain",
                "--health-address", "0", "--metrics-address", "0", env=env, stdout=log, stderr=log,
                stdin=asyncio.subprocess.DEVNULL)
        self.starts += 1

    async def logged(self, text: str, timeout: float) -> bool:
        """Whether the current run logs `text` within `timeout` seconds (e.g. that it reached a host)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process is not None and self.process.returncode is None:
            with self.log_path.open("rb") as log:
                log.seek(self._run_offset)
                if text.encode() in log.read():
                    return True
            await asyncio.sleep(0.05)
        return False

    async def kill(self) -> None:
        """SIGKILL: no handler, no cleanup, no finally runs in the operator."""
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            self.kills += 1
        else:
            self.exits_of_its_own.append(self.process.returncode)
        await self.process.wait()

    async def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM, as a rollout would; SIGKILL when it does not end in time."""
        if self.process is None:
            return
        if self.process.returncode is not None:  # it ended before being asked to
            self.exits_of_its_own.append(self.process.returncode)
            self.process = None
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        self.process = None
