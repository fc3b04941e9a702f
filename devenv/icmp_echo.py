"""One ICMP echo (a ping) to an IPv4 address, without the `ping` program (the test bed does not install iputils).

Run it inside a libvirt host's network namespace, never in the machine's own (the rule for private addresses):
`ip netns exec <netns> python3 devenv/icmp_echo.py ADDRESS`: exit status 0 when an echo reply came back within the
timeout, 1 otherwise. Needs a raw socket (root). No imports from the project, so it runs as a plain file.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import time

ECHO_REQUEST, ECHO_REPLY = 8, 0
TIMEOUT_S = 2.0


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def echo(address: str, timeout_s: float = TIMEOUT_S) -> bool:
    identifier, sequence = os.getpid() & 0xFFFF, 1
    payload = b"capi-libvirt"
    header = struct.pack("!BBHHH", ECHO_REQUEST, 0, 0, identifier, sequence)
    packet = struct.pack("!BBHHH", ECHO_REQUEST, 0, checksum(header + payload), identifier, sequence) + payload
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        try:
            sock.sendto(packet, (address, 0))
        except OSError:  # no route (yet): no answer
            return False
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                return False
            data, (source, _) = sock.recvfrom(1024)
            header_length = (data[0] & 0x0F) * 4  # the IPv4 header comes with a raw socket's packet
            kind, _, _, reply_id, reply_sequence = struct.unpack("!BBHHH", data[header_length:header_length + 8])
            if source == address and kind == ECHO_REPLY and (reply_id, reply_sequence) == (identifier, sequence):
                return True
    return False


if __name__ == "__main__":
    sys.exit(0 if echo(sys.argv[1]) else 1)
