"""Reproduces a crash of libvirt 9.0's client (Debian 12): two threads calling on ONE connection while a keepalive
timeout closes it (a qemu+tls host whose link goes down), then calls on a new connection once the link is back:
SIGSEGV in the client's RPC event loop. With a connection per thread (capi_libvirt.hypervisor.connection) it survives.

    PYTHONPATH=src:. python hack/libvirt-keepalive-crash.py [shared|per-thread]      (root; link 171 free)
"""

import subprocess
import sys
import threading
import time

import libvirt

from devenv import remote_access as ra
from devenv.libvirt_host import LibvirtHost

SHARED = (sys.argv[1:] or ["shared"])[0] == "shared"
libvirt.registerErrorHandler(lambda *_: None, None)
libvirt.virEventRegisterDefaultImpl()
threading.Thread(target=lambda: [libvirt.virEventRunDefaultImpl() for _ in iter(int, 1)], daemon=True).start()

with ra.RemoteAccess(LibvirtHost("crash-repro", "192.168.171.0/24"), 171) as access:
    uri = access.tls_uri()
    shared: list[libvirt.virConnect | None] = [None]
    lock, stop = threading.Lock(), False

    def connection(mine: list) -> libvirt.virConnect:
        slot = shared if SHARED else mine
        with lock if SHARED else threading.Lock():
            if slot[0] is None or not slot[0].isAlive():
                slot[0] = libvirt.open(uri)
                slot[0].setKeepAlive(5, 3)
            return slot[0]

    def loop(call) -> None:
        mine: list[libvirt.virConnect | None] = [None]
        while not stop:
            try:
                call(connection(mine))
            except libvirt.libvirtError as error:
                print(str(error)[:80], flush=True)
                time.sleep(0.5)
            time.sleep(0.05)

    for call in (lambda c: c.getInfo(), lambda c: c.lookupByName("none") if False else c.listAllDomains()):
        threading.Thread(target=loop, args=(call,), daemon=True).start()
    time.sleep(3)
    print("link down", flush=True)
    subprocess.run(["ip", "link", "set", access.root_link, "down"], check=True)
    subprocess.run(["ip", "route", "add", "unreachable", str(access.link_network)], check=True)
    time.sleep(30)
    print("link up", flush=True)
    subprocess.run(["ip", "route", "del", "unreachable", str(access.link_network)], check=True)
    subprocess.run(["ip", "link", "set", access.root_link, "up"], check=True)
    time.sleep(10)
    stop = True
    print("survived", flush=True)
