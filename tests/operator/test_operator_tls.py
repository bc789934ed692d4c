"""TLS on the operator's HTTP port (`--webhook-tls-cert/--webhook-tls-key`): a real handshake
with a self-signed certificate made here (cryptography), POST /alerts with the bearer token
over it, plain HTTP refused, and a renewed certificate served without a restart."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import pathlib
import ssl
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pagoda.operator import main
from pagoda.operator.web import server as server_mod
from pagoda.operator.web.server import OperatorHttpServer

TOKEN = "tls-token"


def write_cert(directory: pathlib.Path, serial: int) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (its own CA); (cert path, key path)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pagoda-operator")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


def trusting(cert_path: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cert_path)  # verifies the chain and 127.0.0.1


async def peer_serial(port: int, cert_path: str) -> int:
    """A fresh handshake trusting `cert_path`, then GET /healthz on it; the serial number of
    the certificate the server presented."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=trusting(cert_path))
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert (await reader.read()).startswith(b"HTTP/1.1 200 OK")
    finally:
        writer.close()
    return x509.load_der_x509_certificate(der).serial_number


async def test_https_port_with_a_reloaded_certificate(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = write_cert(tmp_path, serial=1)
    monkeypatch.setattr(server_mod, "TLS_RELOAD_S", 0.0)  # look at the files every handshake
    http = OperatorHttpServer(
        "127.0.0.1", 0, is_alive=lambda: True, is_ready=lambda: True, tls=(cert, key)
    )
    await http.start()
    try:
        assert await peer_serial(http.port, cert) == 1
        async with aiohttp.ClientSession() as s:  # plain HTTP on the TLS port gets no answer
            with pytest.raises(aiohttp.ClientError):
                async with s.get(f"http://127.0.0.1:{http.port}/healthz") as r:
                    await r.read()
        with pytest.raises(aiohttp.ClientConnectorCertificateError):  # untrusted: refused
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"https://127.0.0.1:{http.port}/healthz"),
            ):
                pass
        old = str(tmp_path / "old.crt")
        pathlib.Path(old).write_bytes(pathlib.Path(cert).read_bytes())
        cert, key = write_cert(tmp_path, serial=2)  # a renewed Secret: the same files
        with pytest.raises(ssl.SSLCertVerificationError):
            await peer_serial(http.port, old)  # this handshake already gets the new one
        assert await peer_serial(http.port, cert) == 2
    finally:
        await http.stop()


def test_flags_need_both_files(tmp_path: pathlib.Path) -> None:
    parser = main.argparse.ArgumentParser()
    main.add_arguments(parser)
    cert, key = write_cert(tmp_path, serial=3)
    config = main.config_from_args(
        parser.parse_args(["--webhook-tls-cert", cert, "--webhook-tls-key", key])
    )
    assert (config.http_tls_cert, config.http_tls_key) == (cert, key)
    with pytest.raises(ValueError, match="key"):
        main.config_from_args(parser.parse_args(["--webhook-tls-cert", cert]))


async def test_alerts_over_tls_through_the_operator(
    tmp_path: pathlib.Path, start_operator: Any
) -> None:
    cert, key = write_cert(tmp_path, serial=4)
    op = await start_operator(http_tls_cert=cert, http_tls_key=key, webhook_token=TOKEN)
    body = {"version": "4", "status": "firing", "alerts": []}
    conn = aiohttp.TCPConnector(ssl=trusting(cert))
    async with aiohttp.ClientSession(connector=conn) as s:
        url = f"https://127.0.0.1:{op.http_port}/alerts"
        async with s.post(url, json=body) as r:
            assert r.status == 401
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with s.post(url, json=body, headers=headers) as r:
            assert (r.status, (await r.json())["status"]) == (200, "ignored")
