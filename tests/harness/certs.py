"""Throwaway certificates for the TLS tests: a CA and leaf certificates it signs, written as PEM files.

Made with the ``cryptography`` package (a dev dependency) in the test's own temporary folder, so every test
run has fresh keys and nothing secret is ever committed. The leaves carry what a real deployment's would
(docs/controller.md shows the same with openssl): subject alternative names for the addresses the peer
dials, and both TLS server and client use, so one certificate serves a controller's job service and its
mutual-TLS connection to the switch.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lhc_ina.tls import TlsConfig


@dataclass(frozen=True)
class Leaf:
    cert: Path
    key: Path
    ca: Path  # the CA that signed it

    def tls(self, ca: Path | None = None) -> TlsConfig:
        """This identity, trusting ``ca`` (default: its own CA)."""
        return TlsConfig(ca=ca or self.ca, cert=self.cert, key=self.key)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ))
    path.chmod(0o600)


class CertificateAuthority:
    """A CA in ``folder`` (``NAME.ca.pem``); ``issue`` signs leaves for names and IP addresses."""

    def __init__(self, folder: Path, name: str = "lhc-test-ca") -> None:
        self.folder = folder
        self.name = name
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                              content_commitment=False, key_encipherment=False, data_encipherment=False,
                              key_agreement=False, encipher_only=False, decipher_only=False),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.path = folder / f"{name}.ca.pem"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, *, dns: tuple[str, ...] = ("localhost",),
              ips: tuple[str, ...] = ("127.0.0.1",)) -> Leaf:
        """A leaf for ``common_name``, valid for the DNS names and IP addresses given."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        stem = self.folder / f"{self.name}.{common_name}"
        cert_path, key_path = Path(f"{stem}.pem"), Path(f"{stem}.key")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        return Leaf(cert_path, key_path, self.path)
