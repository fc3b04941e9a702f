"""Hypothesis strategies of hostile input, shared by the unit, admission and reconcile tiers, and the settings and
counter that make those runs deterministic and their size visible.

Every string field of a LibvirtMachine (and its template, a LibvirtHost, a bootstrap Secret, object names and labels)
is drawn from: a valid value, a value at its length limit or one past it, XML and shell metacharacters, unicode
(accents, CJK, emoji, bidi controls, noncharacters), control characters, and values of the wrong type. Most specs are
valid but for one to three such fields, so admission is probed field by field rather than refusing everything at the
first one. Numbers come at and around their bounds; MACs unicast, multicast, broadcast, zero or junk; addresses and
CIDRs valid, out of range or junk that only looks like one.
"""

from __future__ import annotations

import collections
import gzip
import random
import string

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# -- determinism --------------------------------------------------------------------------------------------------
# derandomize: the same examples on every run and every machine (no seed to print, nothing to replay); no example
# database (nothing written into the work tree); no deadline (a 2-core machine shared with other tests is slow at
# times, and timing is not what these tests assert). The profile is registered once, here, and named in each test.
settings.register_profile(
    "hostile", derandomize=True, database=None, deadline=None, print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
PROFILE = settings.get_profile("hostile")

# How many examples each tier ran, reported at the end of the session (tests/conftest.py).
COUNTS: collections.Counter[str] = collections.Counter()

# -- text ---------------------------------------------------------------------------------------------------------
XML_META = ["<", ">", "&", "'", '"', "]]>", "<!--", "-->", "<?xml?>", "&amp;", "&#0;", "<![CDATA[", "</name>",
            "<domain>", "xmlns:x='y'"]
SHELL_META = ["$(reboot)", "`id`", ";", "|", "&&", "\n", "\r\n", "\\", "'", '"', "*", "?", "~", "#", "!", "$HOME",
              "${IFS}", "> /etc/passwd", "\t", " "]
UNICODE = ["ü", "ñ", "é", "名前", "🚀", "\u202e", "\u200b", "\ufeff", "\ufffe", "\uffff", "ǅ", "ﬁ", "Å", "İ", "ß",
           "\U0010fffd", "Ω"]
CONTROL = ["\x00", "\x01", "\x07", "\x08", "\x0b", "\x0c", "\x1b", "\x1f", "\x7f", "\x85"]
FIXED_NASTIES = ["", " ", "..", ".", "-", "/", "//", "/..", "../../etc/passwd", "null", "None", "true", "0", "-1",
                 "%s%n", "{{ ds.meta_data }}", "${jndi:ldap://x}", "a" * 4097, "\n" * 3]

PIECES = XML_META + SHELL_META + UNICODE + CONTROL


def hostile_text(max_size: int = 80) -> st.SearchStrategy[str]:
    """Text made to break out of wherever it lands: metacharacters, unicode, control characters, or anything."""
    return st.one_of(
        st.lists(st.sampled_from(PIECES + list(string.ascii_letters[:6])), max_size=max_size // 4 or 1).map("".join),
        st.text(max_size=max_size),
        st.sampled_from(FIXED_NASTIES),
    )


def at_limits(alphabet: str, limit: int) -> st.SearchStrategy[str]:
    """A string of valid characters exactly at `limit`, one past it, or empty."""
    return st.sampled_from([limit, limit + 1, 0, 1]).flatmap(
        lambda size: st.text(alphabet=alphabet, min_size=size, max_size=size))


WRONG_TYPES = st.sampled_from([None, 0, 1.5, True, [], {}, ["x"], {"a": 1}, -1, 2**63, "1"])

LIBVIRT_FIRST = string.ascii_letters + string.digits
LIBVIRT_REST = LIBVIRT_FIRST + "_.+-"


def libvirt_name(limit: int = 255) -> st.SearchStrategy[str]:
    valid = st.builds(lambda a, b: a + b, st.sampled_from(LIBVIRT_FIRST), st.text(LIBVIRT_REST, max_size=30))
    at_limit = st.sampled_from([limit, limit + 1]).map(lambda n: ("a" + "b-." * n)[:n])
    return st.one_of(valid, valid, at_limit)


def dns_label(limit: int = 63) -> st.SearchStrategy[str]:
    valid = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?\Z")
    at_limit = st.sampled_from([limit, limit + 1]).map(lambda n: ("a" + "-b" * n)[:n - 1] + "z")
    return st.one_of(valid, at_limit)


def dns_subdomain(limit: int = 253) -> st.SearchStrategy[str]:
    at_limit = st.sampled_from([limit, limit + 1]).map(lambda n: (("a" * 62 + "b.") * 5)[:n - 1] + "z")
    return st.one_of(dns_label(), st.lists(dns_label(20), min_size=2, max_size=4).map(".".join), at_limit)


def field(valid: st.SearchStrategy[object], max_size: int = 80) -> st.SearchStrategy[object]:
    """A field's value: usually valid, else hostile text or a value of the wrong type."""
    return st.one_of(valid, valid, valid, hostile_text(max_size), WRONG_TYPES)


# -- network ------------------------------------------------------------------------------------------------------
def hexbyte() -> st.SearchStrategy[str]:
    return st.integers(0, 255).map(lambda b: f"{b:02x}")


MACS = st.one_of(
    st.lists(hexbyte(), min_size=5, max_size=5).map(lambda rest: ":".join(["52", *rest])),  # QEMU's, unicast
    st.lists(hexbyte(), min_size=6, max_size=6).map(":".join),  # any: half of them multicast
    st.sampled_from(["01:00:5e:00:00:01", "ff:ff:ff:ff:ff:ff", "00:00:00:00:00:00", "33:33:00:00:00:01",
                     "52:54:00:AB:CD:EF", "52-54-00-ab-cd-ef", "5254.00ab.cdef", "52:54:00:ab:cd", "52:54:00:ab:cd:ef:01",
                     "g2:54:00:ab:cd:ef", "52:54:00:ab:cd:ef\n"]),
    hostile_text(20),
)

IPV4 = st.ip_addresses(v=4).map(str)
IPV6 = st.ip_addresses(v=6).map(str)
ADDRESS_JUNK = st.sampled_from(["999.1.1.1", "1.2.3", "1.2.3.4.5", "::::", ":::1", "1.2.3.04", "a.b.c.d", "fe80::1%eth0",
                                "1.2.3.4 ", "0x7f.0.0.1", "...", "1:2:3:4:5:6:7:8:9", "2001:db8::g", "", "localhost"])
ADDRESSES = st.one_of(IPV4, IPV6, ADDRESS_JUNK, hostile_text(20))
CIDRS = st.one_of(
    st.builds(lambda a, p: f"{a}/{p}", IPV4, st.integers(0, 33)),
    st.builds(lambda a, p: f"{a}/{p}", IPV6, st.integers(0, 129)),
    st.builds(lambda a, p: f"{a}/{p}", ADDRESS_JUNK, st.sampled_from(["24", "999", "0", "-1", "", "024"])),
    st.sampled_from(["192.0.2.10/24", "2001:db8::10/64", "10.0.0.1", "10.0.0.1/", "/24", "10.0.0.1/24/1"]),
    hostile_text(20),
)


def valid_interface() -> st.SearchStrategy[dict[str, object]]:
    attachment = st.one_of(st.fixed_dictionaries({"network": libvirt_name(30)}),
                           st.fixed_dictionaries({"bridge": libvirt_name(14)}))
    static = st.fixed_dictionaries(
        {"addresses": st.lists(st.one_of(st.builds(lambda a, p: f"{a}/{p}", IPV4, st.integers(0, 32)),
                                         st.builds(lambda a, p: f"{a}/{p}", IPV6, st.integers(0, 128))),
                               min_size=1, max_size=8)},
        optional={"gateway": IPV4 | IPV6, "nameservers": st.lists(IPV4 | IPV6, max_size=3)})
    return st.tuples(attachment, st.fixed_dictionaries({}, optional={
        "model": st.sampled_from(["virtio", "e1000", "rtl8139"]),
        "macAddress": st.lists(hexbyte(), min_size=5, max_size=5).map(lambda rest: ":".join(["52", *rest])),
        "static": static,
    })).map(lambda pair: {**pair[0], **pair[1]})


def hostile_interface() -> st.SearchStrategy[dict[str, object]]:
    """An interface with one or more of: both or neither attachment, odd model, bad MAC, bad addresses."""
    return st.fixed_dictionaries({}, optional={
        "network": field(libvirt_name()),
        "bridge": field(libvirt_name(15)),
        "model": field(st.sampled_from(["virtio", "e1000", "rtl8139", "ne2k_pci", "VIRTIO"])),
        "macAddress": MACS,
        "static": st.fixed_dictionaries({"addresses": st.lists(CIDRS, max_size=9)},
                                        optional={"gateway": ADDRESSES, "nameservers": st.lists(ADDRESSES, max_size=4)}),
    })


# -- specs --------------------------------------------------------------------------------------------------------
def kernel_path(valid: bool) -> st.SearchStrategy[object]:
    good = st.one_of(st.just("/boot/vmlinuz"), st.just("/" + "k" * 4095),
                     st.text(st.characters(blacklist_categories=["Cc", "Cs"]).filter(lambda c: c not in "\ufffe\uffff"),
                             min_size=1, max_size=40).map(lambda text: "/" + text))
    if valid:
        return good
    return st.one_of(hostile_text(60).map(lambda text: "/" + text), st.just("/" + "k" * 4096), hostile_text(),
                     WRONG_TYPES)


def kernel_boot(valid: bool) -> st.SearchStrategy[dict[str, object]]:
    good_cmdline = st.one_of(st.just("root=/dev/vda console=ttyS0"), st.just("c" * 4096),
                             st.lists(st.sampled_from([p for p in PIECES if p not in CONTROL and "\r" not in p
                                                       and "\n" not in p and "\t" not in p and p not in "\ufffe\uffff"]),
                                      max_size=40).map("".join))
    cmdline = good_cmdline if valid else st.one_of(st.just("c" * 4097), hostile_text(200), WRONG_TYPES)
    return st.fixed_dictionaries({"kernel": kernel_path(valid)},
                                 optional={"initrd": kernel_path(valid), "cmdline": cmdline})


def image_url(valid: bool) -> st.SearchStrategy[object]:
    """An image URL: http(s), a host, a path; hostile: other schemes, user info, fragments, spaces, control and
    non-ASCII characters, no path, too long."""
    host = st.sampled_from(["images.example.com", "127.0.0.1:8080", "[2001:db8::1]"])
    path = st.lists(st.sampled_from(["a", "b.qcow2", "..", "%2e", "x?y=1", "\u00e9", "~"]), max_size=4).map("/".join)
    good = st.builds(lambda scheme, h, p: f"{scheme}://{h}/{p}", st.sampled_from(["http", "https"]), host, path)
    if valid:
        return good
    bad = st.one_of(good.map(lambda u: u + "#f"), good.map(lambda u: u.replace("://", "://u@", 1)),
                    st.builds(lambda u, t: u + t, good, hostile_text(20)), st.just("ftp://h/x"), st.just("https://h"),
                    st.just("https://h/" + "p" * 2048), hostile_text(40), WRONG_TYPES)
    return st.one_of(good, bad)


def sha256(valid: bool) -> st.SearchStrategy[object]:
    good = st.text("0123456789abcdef", min_size=64, max_size=64)
    if valid:
        return good
    return st.one_of(good, st.text("0123456789abcdefABCDEF", min_size=63, max_size=65), hostile_text(70), WRONG_TYPES)


# Each field of a LibvirtMachine spec: (a valid value, a hostile one).
MACHINE_FIELDS: dict[str, tuple[st.SearchStrategy[object], st.SearchStrategy[object]]] = {
    "providerID": (st.just("libvirt://kvm1/5d64ece4-dc73-59e8-9624-de2ce4c5a35e") | st.just("p" * 512),
                   st.one_of(hostile_text(520), st.just("p" * 513), WRONG_TYPES)),
    "host": (dns_label(62), st.one_of(st.just("h" * 64), hostile_text(), WRONG_TYPES)),
    "cpus": (st.integers(1, 512), st.one_of(st.sampled_from([0, -1, 513, 2**31, 2**63]), WRONG_TYPES)),
    "memoryMiB": (st.sampled_from([128, 2048, 16 * 1024 * 1024]) | st.integers(128, 16 * 1024 * 1024),
                  st.one_of(st.sampled_from([127, 0, -128, 16 * 1024 * 1024 + 1]), WRONG_TYPES)),
    "diskGiB": (st.sampled_from([1, 20, 65536]), st.one_of(st.sampled_from([0, 65537, -20]), WRONG_TYPES)),
    "storagePool": (libvirt_name(254), st.one_of(st.just("p" * 256), hostile_text(), WRONG_TYPES)),
    "domainType": (st.sampled_from(["kvm", "qemu"]), st.one_of(st.sampled_from(["xen", "KVM", "lxc"]), hostile_text())),
    "machineType": (libvirt_name(63), st.one_of(st.just("m" * 65), hostile_text(), WRONG_TYPES)),
    "cpuMode": (st.sampled_from(["host-passthrough", "host-model", "maximum"]),
                st.one_of(st.just("custom"), hostile_text(), WRONG_TYPES)),
    "diskBus": (st.sampled_from(["virtio", "scsi", "sata"]), st.one_of(st.sampled_from(["ide", "floppy"]), hostile_text())),
    "interfaces": (st.lists(valid_interface(), min_size=1, max_size=8),
                   st.one_of(st.lists(hostile_interface(), max_size=9), st.just([]),
                             st.lists(valid_interface(), min_size=9, max_size=9), WRONG_TYPES)),
    "guestAgent": (st.booleans(), WRONG_TYPES),
    "serialLog": (st.booleans(), WRONG_TYPES),
    "kernelBoot": (kernel_boot(True), st.one_of(kernel_boot(False), WRONG_TYPES)),
    "image": (st.one_of(st.fixed_dictionaries({"volume": libvirt_name(254)}, optional={"pool": libvirt_name(254)}),
                        st.fixed_dictionaries({"url": image_url(True), "sha256": sha256(True)},
                                              optional={"pool": libvirt_name(254)})),
              st.one_of(st.fixed_dictionaries({"volume": field(libvirt_name())}, optional={"pool": field(libvirt_name())}),
                        st.fixed_dictionaries({}, optional={"volume": field(libvirt_name()), "url": image_url(False),
                                                            "sha256": sha256(False)}),
                        WRONG_TYPES)),
    "firmware": (st.sampled_from(["bios", "uefi"]), st.one_of(st.sampled_from(["efi", "UEFI", "seabios"]),
                                                                hostile_text(), WRONG_TYPES)),
    "dataDisks": (st.lists(st.fixed_dictionaries({"sizeGiB": st.sampled_from([1, 65536])},
                                                 optional={"bus": st.sampled_from(["virtio", "scsi", "sata"])}),
                           max_size=8),
                  st.one_of(st.lists(st.fixed_dictionaries({"sizeGiB": st.sampled_from([0, 65537, -1, "1"])}),
                                     min_size=1, max_size=2),
                            st.lists(st.fixed_dictionaries({"sizeGiB": st.just(1)}), min_size=9, max_size=9),
                            st.lists(st.fixed_dictionaries({"sizeGiB": st.just(1), "bus": hostile_text(8)}),
                                     min_size=1, max_size=1),
                            WRONG_TYPES)),
    # Topologies of 1 to 8 vCPUs: they match the drawn cpus sometimes, which both admission and the model must agree on.
    "cpuTopology": (st.fixed_dictionaries({"sockets": st.integers(1, 2), "cores": st.integers(1, 2),
                                           "threads": st.integers(1, 2)}),
                    st.one_of(st.fixed_dictionaries({"sockets": st.sampled_from([0, 513, -1]), "cores": st.just(1),
                                                     "threads": st.just(1)}),
                              st.fixed_dictionaries({"sockets": st.just(1)}), WRONG_TYPES)),
    "cpuModel": (st.sampled_from(["qemu64", "Skylake-Client-IBRS", "EPYC-v4", "m" * 64]),
                 st.one_of(st.just("m" * 65), hostile_text(), WRONG_TYPES)),
    "unknownField": (st.nothing(), hostile_text(10)),
}


@st.composite
def machine_spec(draw: st.DrawFn, max_hostile: int = 3) -> dict[str, object]:
    """A LibvirtMachine spec: valid fields (image always, the others when drawn), then 0 to `max_hostile` of them
    replaced by hostile values (or the required image left out)."""
    spec: dict[str, object] = {"image": draw(MACHINE_FIELDS["image"][0])}
    for name in draw(st.lists(st.sampled_from(sorted(MACHINE_FIELDS)), unique=True, max_size=6)):
        spec[name] = draw(MACHINE_FIELDS[name][0]) if name != "unknownField" else None
        spec = {k: v for k, v in spec.items() if v is not None or k != "unknownField"}
    for name in draw(st.lists(st.sampled_from(sorted(MACHINE_FIELDS) + ["-image"]), unique=True,
                              max_size=max_hostile)):
        if name == "-image":
            spec.pop("image", None)
        else:
            spec[name] = draw(MACHINE_FIELDS[name][1])
    return spec


def host_spec() -> st.SearchStrategy[dict[str, object]]:
    uris = st.sampled_from(["qemu:///system", "qemu+ssh://root@kvm1/system", "qemu+tls://kvm1/system",
                            "qemu+tcp://kvm1/system", "qemu+ssh://kvm1/system?keyfile=/x", "xen:///", "qemu://"])
    return st.fixed_dictionaries({"uri": field(st.one_of(uris, hostile_text(40).map(lambda t: "qemu+ssh://" + t)))},
                                 optional={
        "credentialsSecretRef": st.fixed_dictionaries({"name": field(dns_subdomain()), "namespace": field(dns_label())}),
        "failureDomain": field(st.sampled_from(["rack-1", "f" * 256, "f" * 257])),
        "controlPlane": field(st.booleans()),
        "overcommit": st.fixed_dictionaries({}, optional={
            "cpu": field(st.sampled_from([0, 0.5, 4.0, 64, 64.5, -1])),
            "memory": field(st.sampled_from([0, 1.0, 4, 4.01]))}),
        "storagePool": field(libvirt_name()),
        "unschedulable": field(st.booleans()),
        "access": st.fixed_dictionaries({}, optional={
            **{key: st.one_of(st.lists(field(st.sampled_from(["team-*", "*", "default", "a" * 253, "[!x]?"])),
                                       max_size=4), WRONG_TYPES)
               for key in ("namespaces", "storagePools", "networks", "bridges", "images")},
            "imageURLPrefixes": st.one_of(st.lists(field(st.sampled_from([
                "https://images.example.com/capi/", "http://127.0.0.1:8080/", "https://h", "https://u@h/", "ftp://h/",
                "https://h/x?y", "https://h/ a", "https://h/\u00e9/"])), max_size=17), WRONG_TYPES),
            "hostPaths": st.one_of(st.lists(field(st.sampled_from(["/var/lib/kernels/", "/", "/boot", "//x/",
                                                                   "/" + "k" * 4094 + "/"])), max_size=17),
                                   WRONG_TYPES)}),
    })


# -- object metadata ----------------------------------------------------------------------------------------------
LABEL_VALUE_CHARS = string.ascii_letters + string.digits + "-_."


def label_key() -> st.SearchStrategy[str]:
    name = st.one_of(st.from_regex(r"\A[a-z0-9]([a-z0-9._-]{0,10}[a-z0-9])?\Z"),
                     st.sampled_from(["n" * 63, "n" * 64]))
    prefixed = st.builds(lambda prefix, n: f"{prefix}/{n}", dns_subdomain(), name)
    return st.one_of(name, prefixed, hostile_text(20))


def label_value() -> st.SearchStrategy[str]:
    return st.one_of(at_limits(LABEL_VALUE_CHARS, 63).map(lambda v: ("a" + v + "z")[: len(v)] if v else v),
                     st.from_regex(r"\A[A-Za-z0-9]([A-Za-z0-9._-]{0,10}[A-Za-z0-9])?\Z"), hostile_text(20))


def object_metadata() -> st.SearchStrategy[dict[str, object]]:
    return st.fixed_dictionaries({"name": st.one_of(dns_subdomain(), dns_subdomain(), hostile_text(20))},
                                 optional={"labels": st.dictionaries(label_key(), label_value(), max_size=3)})


# -- bootstrap data -----------------------------------------------------------------------------------------------
SECRET_LIMIT = 1024 * 1024  # the API server's limit on a Secret's data, all keys together


def blob(size: int, seed: int, kind: str) -> bytes:
    """`size` bytes of a kind: random binary, gzip (of random cloud-config, cut or padded to size), text with
    metacharacters, or NULs. Random bytes from a seed Hypothesis draws, so big values cost no shrinking."""
    rng = random.Random(seed)
    if kind == "binary":
        return rng.randbytes(size)
    if kind == "gzip":
        raw = gzip.compress(b"#cloud-config\n" + rng.randbytes(size), mtime=0)
        return raw[:size] if len(raw) > size else raw
    if kind == "text":
        pieces = [p.encode("utf-8", "surrogatepass") for p in PIECES]
        out = bytearray(b"#cloud-config\n")
        while len(out) < size:
            out += rng.choice(pieces)
        return bytes(out[:size])
    return b"\x00" * size


def user_data(max_size: int = SECRET_LIMIT) -> st.SearchStrategy[bytes]:
    sizes = st.one_of(st.integers(0, 2048), st.sampled_from([max_size - 64, max_size - 1, max_size, max_size + 1]),
                      st.integers(0, max_size))
    return st.builds(blob, sizes, st.integers(0, 2**32), st.sampled_from(["binary", "gzip", "text", "nul"]))


FORMATS = st.one_of(st.sampled_from([b"cloud-config", b"ignition", b"", b"CLOUD-CONFIG", b"cloud-config\n",
                                     b"\xff\xfe", b"\x00", "clöud-cönfig".encode()]),
                    hostile_text(20).map(lambda t: t.encode("utf-8", "surrogatepass")))
SECRET_KEYS = st.one_of(st.sampled_from(["value", "format", "extra", "a" * 253, "a" * 254, "..", ".", "v-._1"]),
                        hostile_text(10))


def bootstrap_secret_data(max_size: int = SECRET_LIMIT) -> st.SearchStrategy[dict[str, bytes]]:
    """A bootstrap Secret's data: `value` and `format` present, missing or odd, and extra keys."""
    return st.fixed_dictionaries({}, optional={"value": user_data(max_size), "format": FORMATS}).flatmap(
        lambda data: st.dictionaries(SECRET_KEYS, user_data(4096), max_size=2).map(lambda extra: {**extra, **data}))

