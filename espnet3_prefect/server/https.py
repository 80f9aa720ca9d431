"""HTTPS for the embedded Prefect API (README: Security): a certificate per server start.

Off loopback the embedded server serves HTTPS by default (:func:`~espnet3_prefect.server.host.tls_required`).
Each start makes, in memory, a one-off authority and one server certificate it signs, naming where
the server listens (IP and DNS subject alternative names, :func:`certificate_names`). The authority's
key is dropped as soon as it has signed, so its certificate vouches for that one server certificate
and nothing else: a client that trusts it trusts no other server, and a leaked ``ca.pem`` signs nothing.

:class:`ServerTLS` is the folder ``<state dir>/api-tls`` (0700): ``ca.pem`` (what clients verify
with: the client file's ``ssl_cert_file``, ``PREFECT_API_SSL_CERT_FILE``), ``cert.pem`` and
``key.pem`` (the server's, handed to uvicorn by path), each 0600 from its first byte. It is made
before the server starts and removed when that server stops. The key is in no other file, no
command line, no environment and no log.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from espnet3_prefect._internal.util import private_folder, write_private

TLS_DIR_NAME = "api-tls"
CA_NAME, CERT_NAME, KEY_NAME = "ca.pem", "cert.pem", "key.pem"
VALID_DAYS = 397  # a server kept running (deploy-local) keeps its certificate; the longest browsers accept
CLOCK_SKEW_S = 600  # valid from a little before now: compute nodes' clocks may run behind


def certificate_names(address: str, given: str | None = None) -> tuple[list[str], list[str]]:
    """``(IP addresses, DNS names)`` the certificate of a server bound to ``address`` names: the
    address (for a wildcard bind, this machine's name and its interfaces' addresses), ``given``
    when it is a host name (``--server-host login1.cluster``), and ``localhost`` on loopback.

    >>> certificate_names("10.0.0.5", "login1.cluster")
    (['10.0.0.5'], ['login1.cluster'])
    >>> certificate_names("127.0.0.1")
    (['127.0.0.1'], ['localhost'])
    """
    from espnet3_prefect.server.host import interface_addresses, is_loopback

    ips: list[str] = []
    names: list[str] = []
    if address in ("0.0.0.0", "::"):
        ips += interface_addresses()
        names += [socket.getfqdn(), socket.gethostname()]
    else:
        ips.append(address)
    if given and not _is_ip(given) and given not in dict(socket.if_nameindex()).values():
        names.append(given.strip())
    if is_loopback(address):
        names.append("localhost")
    return _unique(ips), _unique(n for n in names if n)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip())
        return True
    except ValueError:
        return False


def _unique(items) -> list[str]:
    return list(dict.fromkeys(items))


def generate_server_pem(ips: list[str], names: list[str]) -> tuple[str, str, str]:
    """``(ca_pem, cert_pem, key_pem)``: a one-off authority and a server certificate it signed for
    ``ips`` and ``names``, with the server's private key; the authority's key is not kept.

    >>> ca, cert, key = generate_server_pem(["10.0.0.5"], ["login1"])
    >>> ca.startswith("-----BEGIN CERTIFICATE-----"), key.startswith("-----BEGIN PRIVATE KEY-----")
    (True, True)
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    start, end = now - dt.timedelta(seconds=CLOCK_SKEW_S), now + dt.timedelta(days=VALID_DAYS)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    label = (ips + names)[0] if ips or names else "server"
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "espnet3-prefect"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"espnet3-prefect API authority for {label}"),
        ]
    )
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    alt = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips] + [x509.DNSName(n) for n in names]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, label[:64])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca.public_bytes(pem).decode(), cert.public_bytes(pem).decode(), key_pem.decode()


def _usage(cert_sign: bool):
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


@dataclass(frozen=True)
class ServerTLS:
    """The certificate folder of the embedded server of one state dir (paths only until :meth:`create`).

    >>> tls = ServerTLS.of("/home/me/asr/.e3p/prefect")
    >>> tls.ca_file, tls.key_file
    (PosixPath('/home/me/asr/.e3p/prefect/api-tls/ca.pem'), PosixPath('/home/me/asr/.e3p/prefect/api-tls/key.pem'))
    """

    directory: Path

    @classmethod
    def of(cls, home: str | Path) -> ServerTLS:
        return cls(Path(home) / TLS_DIR_NAME)

    @property
    def ca_file(self) -> Path:
        return self.directory / CA_NAME

    @property
    def cert_file(self) -> Path:
        return self.directory / CERT_NAME

    @property
    def key_file(self) -> Path:
        return self.directory / KEY_NAME

    def create(self, address: str, given: str | None = None) -> ServerTLS:
        """New files for a server bound to ``address`` (``given``: the host as the user named it),
        replacing any a stopped server left."""
        ca_pem, cert_pem, key_pem = generate_server_pem(*certificate_names(address, given))
        private_folder(self.directory)
        write_private(self.key_file, key_pem)
        write_private(self.cert_file, cert_pem)
        write_private(self.ca_file, ca_pem)
        return self

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def ssl_context(self):
        """A client ``ssl.SSLContext`` that trusts this server only (host name checked)."""
        return client_context(str(self.ca_file))


def client_context(cafile: str | None):
    """An ``ssl.SSLContext`` verifying against ``cafile`` (None: the system's authorities); never unverified."""
    import ssl

    return ssl.create_default_context(cafile=cafile)
