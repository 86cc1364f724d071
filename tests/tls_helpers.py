"""A throw-away certificate authority for the TLS tests (nats-server, the gateway's HTTPS, a deployed
cluster): made in the test with `cryptography`, so no test depends on an `openssl` binary or a system CA."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.services import LOOPBACK


class Pki:
    """A CA and certificates it signs, each written as PEM files in `base`."""

    def __init__(self, base: Path, name: str) -> None:
        self.base = base
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
        self.name = subject
        self.cert = (
            self._builder(subject, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.ca_path = base / f"{name}-ca.pem"
        self.ca_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def _builder(self, subject: x509.Name, key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(getattr(self, "name", subject))
            .public_key(key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def issue(self, name: str, *, server: bool) -> tuple[Path, Path]:
        """(certificate, key) files for `name`; a server certificate is valid for 127.0.0.1, and for both
        ends of a TLS connection (cluster members dial each other's routes with it)."""
        key = ec.generate_private_key(ec.SECP256R1())
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = self._builder(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), key.public_key()
        ).add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address(LOOPBACK)), x509.DNSName("localhost")]
                ),
                critical=False,
            )
        cert_path, key_path = self.base / f"{name}.pem", self.base / f"{name}-key.pem"
        cert_path.write_bytes(
            builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        )
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return cert_path, key_path
