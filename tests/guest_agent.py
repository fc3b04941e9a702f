"""Looking inside a running guest through its QEMU guest agent (libvirt's qemuAgentCommand): run a shell command and
read its output, as a test's eyes in the guest (no SSH, no network path needed). The node image runs qemu-guest-agent
(hack/build-guest-image.sh) and the provider gives every domain the agent channel."""

from __future__ import annotations

import base64
import json
import time

import libvirt
import libvirt_qemu

AGENT_TIMEOUT_S = 30
EXEC_DEADLINE_S = 60.0


def agent(domain: libvirt.virDomain, command: str, **arguments) -> dict:
    reply = libvirt_qemu.qemuAgentCommand(domain, json.dumps({"execute": command, "arguments": arguments}),
                                          AGENT_TIMEOUT_S, 0)
    return json.loads(reply)["return"]


def guest_shell(host, uuid: str, script: str) -> str:
    """`sh -c script` in the guest of domain `uuid` on `host`; its standard output (errors are the test's failure)."""
    with host.connect() as conn:
        domain = conn.lookupByUUIDString(uuid)
        pid = agent(domain, "guest-exec", path="/bin/sh", arg=["-c", script], **{"capture-output": True})["pid"]
        deadline = time.monotonic() + EXEC_DEADLINE_S
        while time.monotonic() < deadline:
            status = agent(domain, "guest-exec-status", pid=pid)
            if status.get("exited"):
                out = base64.b64decode(status.get("out-data", "")).decode(errors="replace")
                err = base64.b64decode(status.get("err-data", "")).decode(errors="replace")
                assert status.get("exitcode") == 0, f"{script!r} in the guest failed: {err or out}"
                return out
            time.sleep(0.2)
    raise AssertionError(f"{script!r} in the guest did not end within {EXEC_DEADLINE_S:.0f}s")


def agent_answers(host, uuid: str) -> bool:
    """Whether the guest's agent answers a ping (after a reboot: once the new boot has started it)."""
    with host.connect() as conn:
        try:
            agent(conn.lookupByUUIDString(uuid), "guest-ping")
            return True
        except libvirt.libvirtError:
            return False
