"""HTTPS on a real node: the client, schedctl and the worker SDK verify the
certificate against a private CA, and refuse a server they cannot verify."""
from __future__ import annotations

import datetime as dt
import ipaddress
import pathlib
import ssl
import subprocess
import sys
import urllib.request

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from schedulerd.errors import Unavailable
from schedulerd.sdk.client import Client
from schedulerd.sdk.worker import Worker
from tests.integration.harness import running, wait_until

pytestmark = pytest.mark.integration


def make_ca_and_cert(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """A private CA and a server certificate for 127.0.0.1 signed by it (PEM files)."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "schedulerd test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def test_https_is_verified_against_the_given_ca(make_cluster, tmp_path: pathlib.Path) -> None:
    ca, cert, key = make_ca_and_cert(tmp_path)
    cluster = make_cluster(1, ["--tls-cert", str(cert), "--tls-key", str(key)], ready=False)
    node = cluster.nodes[0]
    url = f"https://127.0.0.1:{node.http_port}"
    context = ssl.create_default_context(cafile=str(ca))
    wait_until(lambda: urllib.request.urlopen(f"{url}/readyz", context=context, timeout=2).status == 200, 30,
               "the HTTPS node")

    client = Client(url, ca_file=str(ca))
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    assert client.create_job({"job_id": "tls", "schedule": {"at": now}, "queue": "q"})["job_id"] == "tls"
    with pytest.raises(Unavailable, match="CERTIFICATE_VERIFY_FAILED"):
        Client(url, timeout_s=2).get_job("tls")  # the system CAs do not know this one
    out = subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", url, "--ca-file", str(ca), "get", "tls"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "job_id:" in out.stdout

    worker = Worker([url], wait_s=1, ca_file=str(ca))
    worker.handler("q")(lambda task: "over tls")
    with running(worker):
        wait_until(lambda: worker.stats.acked == 1, 15, "the task acked over HTTPS")
