"""A fleet's certificate authority: the CA, the broker's certificate and one client certificate
per device and for the server, made with ``cryptography``'s x509 builder.

    ca = FleetCA.create(Path("certs"), fleet="lab")          # certs/ca.crt, certs/ca.key
    ca.issue_broker("broker.lan", ips=["192.168.1.10"])       # certs/broker.crt, .key
    ca.issue_client("pi-07")                                  # certs/pi-07.crt, .key (CN = pi-07)

The broker's key is handed to the ``mosquitto`` user when root runs this (Mosquitto started as
root reads its files as that user). Mosquitto's TLS listener (``require_certificate true``,
``use_identity_as_username true``) takes a client certificate's common name as the MQTT username, so
the CN of a device's certificate is its device id and the same ACL block applies as with passwords.
Private keys are written with mode 0600 and never printed; an existing key is never overwritten
(issue again under a new name, or delete it first, to rotate).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from edgefl.errors import ConfigError

CA_DAYS = 3650
LEAF_DAYS = 825


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 from the first byte on (no window where others can read
    it)."""
    if path.exists():
        raise ConfigError(
            f"{path} exists; refusing to overwrite a private key (remove it first to rotate)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    tmp.replace(path)


@dataclass
class FleetCA:
    directory: Path
    cert: object  # cryptography.x509.Certificate
    key: object  # an EllipticCurvePrivateKey

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    @classmethod
    def create(cls, directory: Path, fleet: str = "edgefl") -> FleetCA:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        directory = Path(directory)
        if (directory / "ca.key").exists():
            raise ConfigError(
                f"{directory / 'ca.key'} exists: this directory already holds a fleet CA"
            )
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"edgefl fleet CA {fleet}")])
        now = dt.datetime.now(dt.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        pem_key = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _write_private(directory / "ca.key", pem_key)
        _write_public(directory / "ca.crt", cert.public_bytes(serialization.Encoding.PEM))
        return cls(directory, cert, key)

    @classmethod
    def load(cls, directory: Path) -> FleetCA:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        directory = Path(directory)
        try:
            cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
            key = serialization.load_pem_private_key(
                (directory / "ca.key").read_bytes(), password=None
            )
        except FileNotFoundError:
            raise ConfigError(
                f"{directory} holds no fleet CA (create one with `edgefl broker ca`)"
            ) from None
        except ValueError as e:
            raise ConfigError(f"{directory}: unreadable CA files: {e}") from None
        return cls(directory, cert, key)

    def _issue(
        self, common_name: str, *, server: bool, hosts: list[str] = (), ips: list[str] = ()
    ) -> tuple[Path, Path]:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        crt_path, key_path = (
            self.directory / f"{common_name}.crt",
            self.directory / f"{common_name}.key",
        )
        if key_path.exists():
            raise ConfigError(
                f"{key_path} exists; refusing to overwrite a private key (remove it first to "
                "rotate)"
            )
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if server:
            names = [x509.DNSName(h) for h in hosts]
            try:
                names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
            except ValueError as e:
                raise ConfigError(f"invalid IP address for the broker certificate: {e}") from None
            if not names:
                raise ConfigError(
                    "the broker certificate needs at least one host name or IP address"
                )
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        pem_key = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _write_private(key_path, pem_key)
        _write_public(crt_path, cert.public_bytes(serialization.Encoding.PEM))
        return crt_path, key_path

    def issue_broker(
        self,
        hosts: list[str] = ("localhost",),
        ips: list[str] = ("127.0.0.1",),
        name: str = "broker",
    ) -> tuple[Path, Path]:
        """The broker's server certificate; clients check the host they dial against
        ``hosts``/``ips``. Its key goes to the ``mosquitto`` user when root issues it
        (:func:`edgefl.transport.accounts.for_mosquitto`)."""
        from edgefl.transport.accounts import for_mosquitto

        crt, key = self._issue(name, server=True, hosts=list(hosts), ips=list(ips))
        for_mosquitto(key)
        return crt, key

    def issue_client(self, username: str) -> tuple[Path, Path]:
        """A client certificate whose CN is ``username`` (a device id, or the server's account)."""
        from edgefl.transport.broker import check_device_id

        check_device_id(username)
        return self._issue(username, server=False)
