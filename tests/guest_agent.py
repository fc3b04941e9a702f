"""Looking inside a running guest through its QEMU guest agent (libvirt's qemuAgentCommand): run a shell command and
read its output, as a test's eyes in the guest (no SSH, no network path needed). The guest images run
qemu-guest-agent (hack/build-guest-image.sh) and the provider gives every domain the agent channel.

Blocking calls on a connection of their own; async tests run them with `asyncio.to_thread`."""

from __future__ import annotations

import base64
import json
import time

import libvirt
import libvirt_qemu

AGENT_TIMEOUT_S = 30  # one agent command's answer (libvirt's timeout, seconds)
EXEC_DEADLINE_S = 60.0


def agent(domain: libvirt.virDomain, command: str, **arguments) -> dict:
    """One guest agent command (guest-ping, guest-exec, ...); its `return` value."""
    reply = libvirt_qemu.qemuAgentCommand(domain, json.dumps({"execute": command, "arguments": arguments}),
                                          AGENT_TIMEOUT_S, 0)
    return json.loads(reply)["return"]


def guest_output(host, uuid: str, script: str) -> bytes:
    """`sh -c script` in the guest of domain `uuid` on `host`; its standard output, once it exited 0 (anything else
    is the test's failure, with its exit code and standard error)."""
    with host.connect() as conn:
        domain = conn.lookupByUUIDString(uuid)
        pid = agent(domain, "guest-exec", path="/bin/sh", arg=["-c", script], **{"capture-output": True})["pid"]
        deadline = time.monotonic() + EXEC_DEADLINE_S
        while time.monotonic() < deadline:
            status = agent(domain, "guest-exec-status", pid=pid)
            if status.get("exited"):
                out = base64.b64decode(status.get("out-data", ""))
                err = base64.b64decode(status.get("err-data", "")).decode(errors="replace")
                assert status.get("exitcode") == 0, f"{script!r} in the guest exited {status.get('exitcode')}: {err}"
                return out
            time.sleep(0.2)
    raise AssertionError(f"{script!r} in the guest did not end within {EXEC_DEADLINE_S:.0f}s")


def guest_shell(host, uuid: str, script: str) -> str:
    """guest_output, as text."""
    return guest_output(host, uuid, script).decode(errors="replace")


# systemd's own account of a finished boot (once it has finished, waiting up to 45 s, within EXEC_DEADLINE_S): the
# time to its default target, the slowest units, the chain that set it.
BOOT_PROFILE = ("timeout 45 systemctl is-system-running --wait >/dev/null; systemd-analyze time; echo; "
                "systemd-analyze blame --no-pager | head -n 20; echo; systemd-analyze critical-chain --no-pager; true")


def boot_profile(host, uuid: str) -> str:
    """What the guest's boot spent, for the timing report; a report's figure, so a failure to read it is its text,
    never the calling test's failure."""
    try:
        return guest_shell(host, uuid, BOOT_PROFILE)
    except (AssertionError, libvirt.libvirtError) as error:
        return f"(no boot profile: {error})"


def agent_answers(host, uuid: str) -> bool:
    """Whether the guest's agent answers a ping (it starts some seconds after the guest's network; after a reboot,
    once the new boot has started it)."""
    with host.connect() as conn:
        try:
            agent(conn.lookupByUUIDString(uuid), "guest-ping")
            return True
        except libvirt.libvirtError:
            return False
