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
import yaml
from autoscale_helpers import require_tool
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from e2e_processes import Processes, alertmanager_cmd, alertmanager_config, free_port, wait_http
from operator_harness import wait_for
from operator_helpers import sample
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


async def test_alertmanager_delivers_over_tls(tmp_path: pathlib.Path, start_operator: Any) -> None:
    """Alertmanager (Debian's binary) with the chart example's receiver plus `tls_config`
    (what the chart's AlertmanagerConfig renders with webhook.tls) reaches the operator's
    HTTPS port, verifying its certificate; a client without the token still gets 401."""
    binary = require_tool("prometheus-alertmanager", "alertmanager")
    cert, key = write_cert(tmp_path, serial=4)
    op = await start_operator(http_tls_cert=cert, http_tls_key=key, webhook_token=TOKEN)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = alertmanager_config(op.http_port, token_file)
    (hook,) = next(r for r in config["receivers"] if r["name"] == "pagoda-operator")[
        "webhook_configs"
    ]
    hook["url"] = hook["url"].replace("http://", "https://")
    hook["http_config"]["tls_config"] = {"ca_file": cert, "server_name": "127.0.0.1"}
    (tmp_path / "am.yml").write_text(yaml.safe_dump(config))
    am_port = free_port()
    procs = Processes(tmp_path)
    try:
        am = procs.start(
            "alertmanager", alertmanager_cmd(binary, tmp_path / "am.yml", tmp_path / "am", am_port)
        )
        await asyncio.to_thread(wait_http, am, f"http://127.0.0.1:{am_port}/-/ready", 30)
        labels = {
            "alertname": "PagodaTTFTHigh",
            "pagoda_action": "scale_up",
            "namespace": "default",
            "inferenceservice": "chat",
        }
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{am_port}/api/v2/alerts"
            async with s.post(url, json=[{"labels": labels}]) as r:
                assert r.status == 200
        conn = aiohttp.TCPConnector(ssl=trusting(cert))
        async with aiohttp.ClientSession(connector=conn) as s:
            base = f"https://127.0.0.1:{op.http_port}"

            async def delivered() -> bool:
                async with s.get(f"{base}/metrics") as r:
                    text = await r.text()
                return (
                    sample(text, "pagoda_operator_alerts_received_total", outcome="ok") or 0
                ) >= 1

            await wait_for(delivered, 30, what=f"Alertmanager's notification\n{am.output()}")
            body = {"version": "4", "status": "firing", "alerts": []}
            async with s.post(f"{base}/alerts", json=body) as r:
                assert r.status == 401
    finally:
        procs.stop_all()
