"""Base image downloads as they happen in the field, against real servers on loopback: HTTPS verified against a
private CA (SSL_CERT_FILE) and refused without it; through an HTTP proxy from HTTPS_PROXY / HTTP_PROXY (a CONNECT
tunnel for https, TLS end to end; an absolute-form GET for http), with the proxy's credentials sent and never shown;
NO_PROXY going direct. The product's own download code (capi_libvirt.download) makes every request."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from capi_libvirt import download
from devenv import remote_access
from devenv.http_proxy import HttpProxy
from devenv.image_server import ImageServer, Served

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

IMAGE = bytes(range(256)) * 4096  # 1 MiB
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY",
                   "all_proxy")


def fetch(url: str) -> bytes:
    with download.open_image(url, lambda _: True) as opened:
        chunks = []
        while chunk := opened.read():
            chunks.append(chunk)
        assert opened.length == len(IMAGE)
        return b"".join(chunks)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """A private CA and a server certificate for 127.0.0.1 from it."""
    folder = tmp_path_factory.mktemp("tls")
    files = {name: folder / name for name in ("ca.key", "ca.crt", "server.key", "server.crt")}
    remote_access.make_ca(files["ca.key"], files["ca.crt"], "capi-libvirt image test CA")
    remote_access.issue_certificate(files["ca.crt"], files["ca.key"], files["server.key"], files["server.crt"],
                                    "CN=127.0.0.1,O=capi-libvirt", ip="127.0.0.1")
    return files


@pytest.fixture
def no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def https_server(ca) -> Iterator[ImageServer]:
    with ImageServer({"/image.qcow2": Served(IMAGE)}, tls=(ca["server.crt"], ca["server.key"])) as server:
        yield server


@pytest.fixture
def http_server() -> Iterator[ImageServer]:
    with ImageServer({"/image.qcow2": Served(IMAGE)}) as server:
        yield server


def test_https_is_verified_against_the_trusted_cas(https_server, ca, no_proxy_settings):
    url = https_server.url("/image.qcow2")
    no_proxy_settings.setenv("SSL_CERT_FILE", str(ca["ca.crt"]))  # a private CA, as a user adds one
    assert fetch(url) == IMAGE
    no_proxy_settings.delenv("SSL_CERT_FILE")  # the system's CAs alone do not know it
    with pytest.raises(download.DownloadFailed, match="CERTIFICATE_VERIFY_FAILED"):
        fetch(url)


def test_https_goes_through_the_proxys_tunnel_with_tls_end_to_end(https_server, ca, no_proxy_settings):
    no_proxy_settings.setenv("SSL_CERT_FILE", str(ca["ca.crt"]))
    with HttpProxy() as proxy:
        no_proxy_settings.setenv("HTTPS_PROXY", proxy.url)
        assert fetch(https_server.url("/image.qcow2")) == IMAGE
        assert proxy.seen() == [("CONNECT", f"127.0.0.1:{https_server.port}", None)]


def test_no_proxy_goes_direct(https_server, ca, no_proxy_settings):
    no_proxy_settings.setenv("SSL_CERT_FILE", str(ca["ca.crt"]))
    with HttpProxy() as proxy:
        no_proxy_settings.setenv("https_proxy", proxy.url)
        no_proxy_settings.setenv("no_proxy", "example.org,.internal,127.0.0.1")
        assert fetch(https_server.url("/image.qcow2")) == IMAGE
        assert proxy.seen() == []
    assert download.bypassed("images.internal", 443, ".internal")
    assert download.bypassed("internal", 443, ".internal") and download.bypassed("a.b", 8443, "b:8443")
    assert not download.bypassed("a.b", 443, "b:8443") and not download.bypassed("notinternal", 443, "internal")
    assert download.bypassed("anything", None, "*")


def test_http_is_asked_of_the_proxy_with_its_credentials_which_are_never_shown(http_server, no_proxy_settings):
    with HttpProxy(credentials="builder:s3cret-pw") as proxy:
        no_proxy_settings.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://builder:s3cret-pw@"))
        url = http_server.url("/image.qcow2")
        assert fetch(url) == IMAGE
        [(method, target, authorization)] = proxy.seen()
        assert (method, target) == ("GET", url) and authorization is not None and authorization.startswith("Basic ")

        no_proxy_settings.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://builder:wrong-pw@"))
        with pytest.raises(download.DownloadFailed) as refused:
            fetch(url)
        assert "407" in str(refused.value) and "wrong-pw" not in str(refused.value)


def test_an_https_proxy_refusing_the_tunnel_is_a_clear_failure_without_credentials(https_server, no_proxy_settings):
    with HttpProxy(credentials="builder:s3cret-pw") as proxy:
        no_proxy_settings.setenv("HTTPS_PROXY", proxy.url.replace("http://", "http://builder:wrong-pw@"))
        with pytest.raises(download.DownloadFailed) as refused:
            fetch(https_server.url("/image.qcow2"))
    message = str(refused.value)
    assert "through its proxy" in message and "407" in message and "wrong-pw" not in message
