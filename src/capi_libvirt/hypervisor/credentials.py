"""Transport credentials from a Secret, on disk only while a connection is being opened.

libvirt's transports read files: the ssh client its private key and known_hosts, the TLS client a folder with the
CA, certificate and key. They are written into a private temporary folder (0700, files 0600), named in the URI's
query, and removed as soon as the connection is open (or failed to open). A folder's name carries the pid of the
process that made it, so the sweep at operator start removes only what a dead process (or an earlier life of this
pid, in a container restarted in place) left, never the folder another operator sharing /tmp is connecting with. Host-key and certificate verification is
never turned off: a URI may only name its host, user, path and (locally) a socket; any other parameter is refused. libvirt 9's qemu+ssh does not hand known_hosts= to
OpenSSH, so for qemu+ssh libvirt runs a small ssh wrapper (`command=`) that checks strictly against that file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
import urllib.parse
from collections.abc import Iterator, Mapping

SSH_KEY, SSH_KNOWN_HOSTS = "ssh-privatekey", "known_hosts"
SSH_BINARY = "/usr/bin/ssh"
CREDENTIALS_PREFIX = "capi-libvirt-cred-"

TLS_CA, TLS_CERT, TLS_KEY = "ca.crt", "tls.crt", "tls.key"


# The ssh libvirt runs for qemu+ssh (URI parameter `command=`). libvirt calls it as
#   <command> [-p port] [-l user] [-i keyfile] -T -e none [-o BatchMode=yes] [-o StrictHostKeyChecking=no] -- host cmd
# The options given first win in OpenSSH, so even a URI with no_verify=1 cannot turn host key checking off here.
# -F /dev/null: neither ~/.ssh/config nor /etc/ssh/ssh_config applies, and ssh does not create ~/.ssh.
SSH_WRAPPER = """\
#!/bin/sh
# ssh for libvirt's qemu+ssh transport: the host key is checked against the known_hosts file beside the -i key file,
# strictly (an unknown or different key fails), without prompts, with that key only.
key=
previous=
for arg in "$@"; do
  [ "$previous" = "-i" ] && key=$arg
  previous=$arg
done
[ -n "$key" ] || { echo "ssh wrapper: no key file (-i) given" >&2; exit 255; }
known_hosts="$(dirname -- "$key")/known_hosts"
# With an absolute key path, from the key's folder, known_hosts is named by a short relative path: libvirt reports
# ssh's refusal only while its message (which names that file three times) stays under 1 KiB (virFileReadLimFD), and
# a deep folder went over it ("Cannot recv data: Value too large for defined data type").
case "$key" in /*) cd -- "$(dirname -- "$key")" || exit 255; known_hosts=./known_hosts ;; esac
exec {ssh} -F /dev/null \\
  -o UserKnownHostsFile="$known_hosts" -o GlobalKnownHostsFile=/dev/null \\
  -o StrictHostKeyChecking=yes -o UpdateHostKeys=no -o CheckHostIP=no -o BatchMode=yes \\
  -o IdentitiesOnly=yes -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no \\
  -o ConnectTimeout=10 -o ServerAliveInterval=5 -o ServerAliveCountMax=3 "$@"
"""


class CredentialsError(ValueError):
    """The URI and the Secret do not make a verified connection (missing keys, verification turned off)."""


@dataclasses.dataclass(frozen=True)
class Credentials:
    """Secret data by key. Its repr never shows the values."""

    data: Mapping[str, bytes]

    def __repr__(self) -> str:
        return f"Credentials(keys={sorted(self.data)})"


def _write(folder: str, name: str, content: bytes) -> str:
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(content)
    except OSError as error:
        raise CredentialsError(f"cannot write credentials: {error.strerror}") from None
    return path


def _folder_prefix(pid: int) -> str:
    return f"{CREDENTIALS_PREFIX}{pid}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


# The folders this process has open now (materialized's blocks), which its own sweep must leave: an operator started
# again in the same process (the tests run several) finds them under its own pid.
_in_use: set[str] = set()


def sweep_leftovers() -> None:
    """Remove credential folders a crashed earlier run left in the temporary folder (at operator start).

    Only folders of processes that are gone, or of this pid but not open in this process (an earlier life's): another
    live operator's folder may be in use by a connection being opened right now.
    """
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        if not name.startswith(CREDENTIALS_PREFIX):
            continue
        path = os.path.join(tmp, name)
        pid_text = name[len(CREDENTIALS_PREFIX):].partition("-")[0]
        if re.fullmatch(r"[0-9]{1,10}", pid_text):
            pid = int(pid_text)
            if path in _in_use or (pid != os.getpid() and _alive(pid)):
                continue
        shutil.rmtree(path, ignore_errors=True)


# What a URI may say. Everything else in its query (command=, no_verify=, known_hosts_verify=, pkipath=, ...) could
# turn verification off or run a program in the operator's pod, so it is refused; the operator adds its own.
SCHEMES = {"qemu": "unix", "qemu+unix": "unix", "qemu+ssh": "ssh", "qemu+libssh": "libssh", "qemu+tls": "tls"}
USER_PARAMETERS = {"unix": {"socket"}, "ssh": set(), "libssh": set(), "tls": set()}


def check_uri(uri: str) -> str:
    """The transport of an acceptable URI (unix, ssh, libssh, tls); CredentialsError naming what is not accepted."""
    parts = urllib.parse.urlsplit(uri)
    kind = SCHEMES.get(parts.scheme.lower())
    if kind is None:
        raise CredentialsError(f"URI scheme {parts.scheme!r} is not supported; use one of {', '.join(sorted(SCHEMES))}")
    names = {name.lower() for name, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)}
    refused = sorted(names - USER_PARAMETERS[kind])
    if refused:
        raise CredentialsError(f"URI parameters {', '.join(refused)} are not accepted (the operator sets its own)")
    return kind


def _with_query(uri: str, extra: dict[str, str]) -> str:
    """The URI with the operator's parameters appended (the user's part kept byte for byte)."""
    if not extra:
        return uri
    return uri + ("&" if "?" in uri else "?") + urllib.parse.urlencode(extra, safe="/")


def ssh_wrapper(ssh: str = SSH_BINARY) -> str:
    return SSH_WRAPPER.replace("{ssh}", ssh)


@contextlib.contextmanager
def materialized(uri: str, credentials: Credentials | None) -> Iterator[str]:
    """The URI to open, with its credential files present for the duration of the block only."""
    kind = check_uri(uri)
    if kind == "unix":
        yield uri
        return
    if credentials is None:
        raise CredentialsError(f"qemu+{kind} needs a credentials Secret (credentialsSecretRef)")
    try:
        folder = tempfile.mkdtemp(prefix=_folder_prefix(os.getpid()))  # mode 0700
    except OSError as error:
        raise CredentialsError(f"cannot write credentials: {error.strerror}") from None
    _in_use.add(folder)
    try:
        data = credentials.data
        if kind in ("ssh", "libssh"):
            missing = [key for key in (SSH_KEY, SSH_KNOWN_HOSTS) if key not in data]
            if missing:
                raise CredentialsError(f"credentials Secret lacks {', '.join(missing)} for qemu+{kind}")
            keyfile = _write(folder, "id", data[SSH_KEY])
            known_hosts = _write(folder, "known_hosts", data[SSH_KNOWN_HOSTS])
            if kind == "libssh":  # libvirt's own SSH client reads known_hosts itself
                yield _with_query(uri, {"keyfile": keyfile, "known_hosts": known_hosts,
                                        "known_hosts_verify": "normal", "sshauth": "privkey"})
            else:  # OpenSSH ignores known_hosts=: the wrapper makes it check strictly against that file
                wrapper = _write(folder, "ssh", ssh_wrapper().encode())
                os.chmod(wrapper, 0o700)
                yield _with_query(uri, {"keyfile": keyfile, "known_hosts": known_hosts, "no_verify": "0",
                                        "no_tty": "1", "command": wrapper})
        else:
            missing = [key for key in (TLS_CA, TLS_CERT, TLS_KEY) if key not in data]
            if missing:
                raise CredentialsError(f"credentials Secret lacks {', '.join(missing)} for qemu+tls")
            _write(folder, "cacert.pem", data[TLS_CA])
            _write(folder, "clientcert.pem", data[TLS_CERT])
            _write(folder, "clientkey.pem", data[TLS_KEY])
            yield _with_query(uri, {"pkipath": folder})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        _in_use.discard(folder)
