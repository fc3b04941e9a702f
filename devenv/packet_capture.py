"""What a libvirt host's bridge really receives: a capture of UDP datagrams to one port on a bridge inside the host's
network namespace (an AF_PACKET socket, as tcpdump opens one), for tests that prove what a guest can and cannot send.

The capture runs as a child process in the namespace (`ip netns exec`), with this interpreter; it says `ready` once
its socket is bound, and at the end prints one JSON list: [source MAC, source IP, payload] per datagram seen.
"""

from __future__ import annotations

import json
import subprocess
import sys

CAPTURE = r"""
import json, socket, struct, sys, time
bridge, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
sock.bind((bridge, 0))
sock.settimeout(0.2)
print("ready", flush=True)
seen, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    try:
        frame = sock.recv(65535)
    except socket.timeout:
        continue
    ip = frame[14:]
    header = (ip[0] & 15) * 4
    if len(ip) < header + 8 or ip[9] != 17 or struct.unpack("!H", ip[header + 2:header + 4])[0] != port:
        continue
    seen.append([frame[6:12].hex(":"), socket.inet_ntoa(ip[12:16]), ip[header + 8:].decode(errors="replace")])
print(json.dumps(seen), flush=True)
"""


class BridgeCapture:
    """`with BridgeCapture(netns, bridge, port, seconds) as capture:` ... `capture.result()` once it ended."""

    def __init__(self, netns: str, bridge: str, port: int, seconds: float) -> None:
        self.command = ["ip", "netns", "exec", netns, sys.executable, "-c", CAPTURE, bridge, str(port), str(seconds)]
        self.seconds = seconds
        self.process: subprocess.Popen[str] | None = None

    def __enter__(self) -> BridgeCapture:
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if line != "ready":
            self.process.kill()
            raise RuntimeError(f"the capture did not start: {line!r} {self.process.stderr.read() if self.process.stderr else ''}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def result(self) -> list[tuple[str, str, str]]:
        """Every datagram seen ([source MAC, source IP, payload]), once the capture's time is up."""
        assert self.process is not None
        out, err = self.process.communicate(timeout=self.seconds + 30)
        if self.process.returncode != 0:
            raise RuntimeError(f"the capture failed ({self.process.returncode}): {err}")
        return [tuple(item) for item in json.loads(out.strip().splitlines()[-1])]  # type: ignore[misc]
