"""A libvirt test host reached the way users reach real hosts: qemu+tls and qemu+ssh, with every check on.

RemoteAccess takes a LibvirtHost that is not started yet and starts it with:
- a veth link from the machine's own network namespace into the host's: 198.18.<n>.1/30 outside, 198.18.<n>.2/30
  inside (198.18.0.0/15 is the benchmarking range: no private address is ever used outside the namespace);
- libvirtd listening for TLS on 198.18.<n>.2:16514 (no plain TCP), with a CA of its own, a server certificate for
  that IP, client certificates verified and restricted to the one client DN issued here;
- an sshd on 198.18.<n>.2:22, in the namespaces of the host's libvirtd (so `/run/libvirt/libvirt-sock` over there is
  this host's socket and plain `qemu+ssh://root@<ip>/system` reaches it), with a host key of its own, public-key
  authentication of one authorized key only, no passwords.

The client side lives in `client_dir`: the TLS `pkipath` folder (cacert.pem, clientcert.pem, clientkey.pem) and, for
SSH, the key `id` with its `known_hosts` beside it. libvirt's qemu+ssh transport runs OpenSSH's `ssh` and passes it
`-i <keyfile>` but never the URI's `known_hosts` (that parameter is read only by the libssh/libssh2 transports): with
plain `ssh` the host key would be checked against the user's ~/.ssh/known_hosts. So ssh_uri names a wrapper
(`command=`, see hypervisor.credentials.SSH_WRAPPER) that checks strictly against the known_hosts file beside the key and never prompts.

The key material never leaves the private folder (0700); stop() ends sshd by PID, removes the link, stops the host
and removes the folder. Starting it again clears what a killed run left.
"""

from __future__ import annotations

import ipaddress
import logging
import pathlib
import secrets
import shutil
import socket
import subprocess
import textwrap
import time
import urllib.parse
from types import TracebackType

from capi_libvirt.hypervisor import credentials
from devenv import paths
from devenv.libvirt_host import LibvirtHost, LibvirtHostError, process_alive, run, terminate

log = logging.getLogger(__name__)

LINK_PREFIX = "198.18"  # link n: 198.18.<n>.0/30, out of the benchmarking range 198.18.0.0/15
TLS_PORT = 16514
SSH_PORT = 22
SSHD_START_TIMEOUT_S = 15.0
CERT_DAYS = 7

class RemoteAccessError(LibvirtHostError):
    pass


class RemoteAccess:
    """A LibvirtHost reachable over qemu+tls and qemu+ssh from the machine's namespace; a context manager.

    `link_index` (0..255) picks the link's addresses, 198.18.<n>.1 outside and 198.18.<n>.2 inside: give every host
    running at the same time its own. start() starts the host too, stop() stops it."""

    def __init__(self, host: LibvirtHost, link_index: int, *, folder: pathlib.Path | None = None) -> None:
        if not 0 <= link_index <= 255:
            raise RemoteAccessError(f"link index {link_index} outside 0..255")
        self.host = host
        self.link_index = link_index
        link = ipaddress.IPv4Network(f"{LINK_PREFIX}.{link_index}.0/30")
        self.link_network = link
        self.root_address, self.address = (str(ip) for ip in list(link.hosts())[:2])
        self.root_link = f"clvra{link_index}"  # the root namespace's end; the other end is `remote0` in the host's
        self.netns_link = "remote0"
        self.folder = folder or paths.run_dir() / f"{host.name}.remote"
        self._sshd: subprocess.Popen[bytes] | None = None
        self._hook_of_host = host.before_daemons

    # -- where things are -------------------------------------------------------------------------------------------

    @property
    def server_dir(self) -> pathlib.Path:
        """The daemons' side: CA key, libvirtd's certificate and key, sshd's config, host key and authorized keys."""
        return self.folder / "server"

    @property
    def client_dir(self) -> pathlib.Path:
        """The client's side: cacert.pem, clientcert.pem, clientkey.pem (the TLS pkipath); id, known_hosts (SSH)."""
        return self.folder / "client"

    @property
    def ssh_key(self) -> pathlib.Path:
        return self.client_dir / "id"

    @property
    def known_hosts(self) -> pathlib.Path:
        return self.client_dir / "known_hosts"

    @property
    def ssh_command(self) -> pathlib.Path:
        return self.folder / "ssh"

    @property
    def sshd_log(self) -> pathlib.Path:
        return self.host.log_dir / "sshd.log"

    @property
    def sshd_pid(self) -> int | None:
        return self._sshd.pid if self._sshd is not None else None

    @property
    def client_dn(self) -> str:
        """The one client DN libvirtd accepts (tls_allowed_dn_list); a client certificate of its own needs it."""
        return f"CN=capi-libvirt client {self.host.name},O=capi-libvirt"

    def tls_uri(self, pkipath: pathlib.Path | None = None) -> str:
        """qemu+tls with the server certificate and its IP verified; `pkipath` holds cacert.pem, clientcert.pem and
        clientkey.pem (default: this host's client folder)."""
        return uri("tls", self.address, pkipath=str(pkipath or self.client_dir))

    def ssh_uri(self, keyfile: pathlib.Path | None = None, *, wrapper: bool = True) -> str:
        """qemu+ssh as root with `keyfile` (default: this host's client key); the host key is checked against the
        known_hosts file beside it. Without `wrapper` libvirt runs plain `ssh`, which ignores known_hosts=."""
        keyfile = keyfile or self.ssh_key
        params = {"keyfile": str(keyfile), "known_hosts": str(keyfile.parent / "known_hosts"),
                  "no_verify": "0", "no_tty": "1"}
        if wrapper:
            params["command"] = str(self.ssh_command)
        return uri("ssh", self.address, user="root", **params)

    def libssh_uri(self, keyfile: pathlib.Path | None = None) -> str:
        """qemu+libssh (libvirt's built-in SSH client), which reads keyfile= and known_hosts= itself."""
        keyfile = keyfile or self.ssh_key
        return uri("libssh", self.address, user="root", keyfile=str(keyfile),
                   known_hosts=str(keyfile.parent / "known_hosts"), known_hosts_verify="normal", sshauth="privkey")

    # -- life cycle -------------------------------------------------------------------------------------------------

    def __enter__(self) -> RemoteAccess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Keys and certificates, then the host (its libvirtd listening for TLS on the link), then sshd."""
        if self.folder.exists():
            log.warning("remote access %s: clearing what an earlier run left behind", self.host.name)
            shutil.rmtree(self.folder)
        try:
            self._write_keys()
            self.host.libvirtd_settings.update(self._libvirtd_tls_settings())
            self.host.before_daemons = self._before_daemons
            self.host.start()
            self._start_sshd()
        except BaseException:
            self.stop()
            raise
        log.info("remote access %s ready: %s and %s", self.host.name, self.tls_uri(), self.ssh_uri())

    def stop(self) -> None:
        """sshd by PID, the link, the host, the folder; harmless when repeated."""
        if self._sshd is not None:
            log.info("remote access %s: stopping sshd (pid %d)", self.host.name, self._sshd.pid)
            terminate(self._sshd.pid)
            self._sshd.wait()
            self._sshd = None
        if self._root_link_is_ours():
            run(["ip", "link", "delete", self.root_link], check=False)
        self.host.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- start, step by step ----------------------------------------------------------------------------------------

    def _write_keys(self) -> None:
        for folder in (self.folder, self.server_dir, self.client_dir):
            folder.mkdir(mode=0o700, parents=True)
        server, client = self.server_dir, self.client_dir
        make_ca(server / "cakey.pem", client / "cacert.pem", f"capi-libvirt test CA {self.host.name}")
        issue_certificate(client / "cacert.pem", server / "cakey.pem", server / "serverkey.pem",
                          server / "servercert.pem", f"CN={self.address},O=capi-libvirt", ip=self.address)
        issue_certificate(client / "cacert.pem", server / "cakey.pem", client / "clientkey.pem",
                          client / "clientcert.pem", self.client_dn)
        ssh_keygen(server / "ssh_host_ed25519_key", f"sshd {self.host.name}")
        ssh_keygen(self.ssh_key, f"client {self.host.name}")
        shutil.copyfile(self.ssh_key.with_suffix(".pub"), server / "authorized_keys")
        self.known_hosts.write_text(known_hosts_line(self.address, server / "ssh_host_ed25519_key.pub"))
        (server / "sshd_config").write_text(self._sshd_config())
        self.ssh_command.write_text(credentials.ssh_wrapper())
        self.ssh_command.chmod(0o700)

    def _libvirtd_tls_settings(self) -> dict[str, str | int | list[str]]:
        return {
            "listen_tls": 1,
            "listen_tcp": 0,
            "listen_addr": self.address,
            "tls_port": str(TLS_PORT),
            "auth_tls": "none",  # the client certificate is the credential
            "key_file": str(self.server_dir / "serverkey.pem"),
            "cert_file": str(self.server_dir / "servercert.pem"),
            "ca_file": str(self.client_dir / "cacert.pem"),
            "tls_no_verify_certificate": 0,
            "tls_allowed_dn_list": [self.client_dn],
        }

    def _sshd_config(self) -> str:
        server = self.server_dir
        return textwrap.dedent(f"""\
            ListenAddress {self.address}:{SSH_PORT}
            HostKey {server / "ssh_host_ed25519_key"}
            PidFile none
            AuthorizedKeysFile {server / "authorized_keys"}
            AuthenticationMethods publickey
            PubkeyAuthentication yes
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            PermitEmptyPasswords no
            PermitRootLogin prohibit-password
            AllowUsers root
            UsePAM no
            StrictModes yes
            PermitUserEnvironment no
            AllowTcpForwarding no
            AllowAgentForwarding no
            X11Forwarding no
            PrintMotd no
            LogLevel VERBOSE
            """)

    def _before_daemons(self, host: LibvirtHost) -> None:
        if self._hook_of_host is not None:
            self._hook_of_host(host)
        self._create_link()

    def _root_link_is_ours(self) -> bool:
        """The root end exists and carries this link's address (a link of the same name could be another host's)."""
        out = run(["ip", "-brief", "address", "show", "dev", self.root_link], check=False).stdout
        return f"{self.root_address}/30" in out

    def _create_link(self) -> None:
        """Called by the host once its namespace exists, so libvirtd can listen on the namespace's address."""
        if run(["ip", "link", "show", "dev", self.root_link], check=False).returncode == 0:
            raise RemoteAccessError(f"link {self.root_link} exists: link index {self.link_index} is in use")
        used = run(["ip", "-4", "-brief", "address", "show", "to", str(self.link_network)], check=False).stdout
        if used.strip():
            raise RemoteAccessError(f"addresses of {self.link_network} are in use: {used.strip()}")
        netns = self.host.netns
        for argv in (
            ["ip", "link", "add", self.root_link, "type", "veth", "peer", "name", self.netns_link, "netns", netns],
            ["ip", "address", "add", f"{self.root_address}/30", "dev", self.root_link],
            ["ip", "link", "set", self.root_link, "up"],
            ["ip", "-n", netns, "address", "add", f"{self.address}/30", "dev", self.netns_link],
            ["ip", "-n", netns, "link", "set", self.netns_link, "up"],
        ):
            run(argv)
        log.info("remote access %s: link %s %s <-> %s %s (netns %s)", self.host.name,
                 self.root_link, self.root_address, self.netns_link, self.address, netns)

    def _start_sshd(self) -> None:
        # sshd's privilege separation folder is compiled in; it is the one trace left, like /run/libvirt.
        pathlib.Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        libvirtd = self.host._read_pid("libvirtd")
        if libvirtd is None:
            raise RemoteAccessError(f"libvirtd of host {self.host.name} has no pid file")
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        argv = ["nsenter", f"--mount=/proc/{libvirtd}/ns/mnt", f"--net=/run/netns/{self.host.netns}", "--",
                sshd, "-D", "-e", "-f", str(self.server_dir / "sshd_config")]
        self.sshd_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.sshd_log, "ab") as log_file:
            # nsenter execs sshd: the child's PID is sshd's.
            self._sshd = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
        deadline = time.monotonic() + SSHD_START_TIMEOUT_S
        while not port_open(self.address, SSH_PORT):
            if self._sshd.poll() is not None or not process_alive(self._sshd.pid):
                raise RemoteAccessError(f"sshd of host {self.host.name} exited; see {self.sshd_log}:\n"
                                        f"{self.sshd_log.read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                raise RemoteAccessError(f"sshd of host {self.host.name} not listening within {SSHD_START_TIMEOUT_S} s")
            time.sleep(0.05)
        log.info("remote access %s: sshd (pid %d) on %s:%d", self.host.name, self._sshd.pid, self.address, SSH_PORT)


# -- keys and certificates ----------------------------------------------------------------------------------------

def uri(transport: str, address: str, *, user: str | None = None, **params: str) -> str:
    netloc = f"{user}@{address}" if user else address
    return f"qemu+{transport}://{netloc}/system?" + urllib.parse.urlencode(params, safe="/",
                                                                            quote_via=urllib.parse.quote)


def openssl(*args: str) -> None:
    run(["openssl", *args])


def new_key(path: pathlib.Path) -> None:
    """An EC P-256 private key, mode 0600."""
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    path.chmod(0o600)


def make_ca(key: pathlib.Path, cert: pathlib.Path, common_name: str) -> None:
    """A self-signed CA certificate (CA:TRUE, keyCertSign) and its key."""
    new_key(key)
    openssl("req", "-new", "-x509", "-key", str(key), "-out", str(cert), "-days", str(CERT_DAYS),
            "-subj", f"/CN={common_name}/O=capi-libvirt",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")


def issue_certificate(ca_cert: pathlib.Path, ca_key: pathlib.Path, key: pathlib.Path, cert: pathlib.Path,
                      dn: str, *, ip: str | None = None) -> None:
    """A certificate signed by the CA for `dn` ("CN=...,O=..."): a server certificate for `ip` (SAN IP) when one is
    given, else a client certificate; the extensions libvirt checks (key usage, extended key usage) included."""
    new_key(key)
    csr = cert.with_suffix(".csr")
    extensions = cert.with_suffix(".ext")
    usage = "serverAuth" if ip else "clientAuth"
    extensions.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage={usage}\n"
        + (f"subjectAltName=IP:{ip}\n" if ip else ""))
    subject = "/" + "/".join(dn.split(","))  # "CN=a,O=b" -> "/CN=a/O=b", which GnuTLS reads back as "CN=a,O=b"
    try:
        openssl("req", "-new", "-key", str(key), "-out", str(csr), "-subj", subject)
        openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
                "-set_serial", str(secrets.randbits(63)), "-days", str(CERT_DAYS), "-out", str(cert),
                "-extfile", str(extensions))
    finally:
        csr.unlink(missing_ok=True)
        extensions.unlink(missing_ok=True)


def ssh_keygen(path: pathlib.Path, comment: str) -> None:
    """An ed25519 key pair without passphrase: `path` (0600) and `path`.pub."""
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def known_hosts_line(address: str, public_key: pathlib.Path, port: int = SSH_PORT) -> str:
    host = address if port == 22 else f"[{address}]:{port}"
    key_type, key = public_key.read_text().split()[:2]
    return f"{host} {key_type} {key}\n"


def port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False
