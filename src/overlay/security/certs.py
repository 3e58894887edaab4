"""Development certificates: a local CA, one certificate per node, one per client (``overlay certs dev``).

Rules:

1. One directory holds everything, under fixed names: ``ca.pem`` and
   ``ca.key`` (the CA), ``node-<id>.pem``/``.key`` per node, ``<name>.pem``/
   ``.key`` per client — what a ``[tls]`` table names as ``ca``,
   ``cert = "DIR/node-{id}.pem"``, ``key = "DIR/node-{id}.key"``,
   ``client_cert``, ``client_key`` (``tls_table`` prints it).
2. Identities are SAN URIs (``overlay.security.tls``): ``overlay://node/<id>``
   for a node, ``overlay://client/<name>`` for a client.  A node's
   certificate also names the addresses clients reach it by: ``localhost``,
   ``127.0.0.1``, ``::1`` and its configured host.
3. Idempotent: a file that is still right is kept — signed by this CA,
   naming the same identity and addresses, its key beside it, valid for at
   least ``RENEW_DAYS`` more days; anything else is made (again).  A new CA
   means new certificates for everyone.  A CA certificate without its key
   cannot sign: refused with what to do (``CertError``).
4. Keys are ECDSA P-256 (fast to make and to handshake with), written
   ``0600``; certificates for TLS servers and clients both (a node is each).

These are for development and tests: the CA key sits beside the
certificates.  In production, a real CA signs certificates with the same
URIs (docs/operating.md, "Security").
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final, NamedTuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from overlay.errors import OverlayError
from overlay.security.identity import client_uri, node_uri

__all__ = [
    "CA_DAYS",
    "LEAF_DAYS",
    "RENEW_DAYS",
    "CertError",
    "Made",
    "certificate_uris",
    "make_dev_certs",
    "tls_table",
]

CA_DAYS: Final = 3650
LEAF_DAYS: Final = 825  # the longest TLS clients accept for a leaf certificate
RENEW_DAYS: Final = 30  # rule 3: a certificate closer to its end than this is made again
LOCAL_NAMES: Final = ("localhost",)
LOCAL_ADDRESSES: Final = ("127.0.0.1", "::1")
WILDCARD_HOSTS: Final = frozenset({"", "0.0.0.0", "::"})


class CertError(OverlayError):
    """The certificate directory cannot be used as it is; the message says what to do."""


class Made(NamedTuple):
    """One file of ``make_dev_certs``: its path, and whether it was made now or kept."""

    path: Path
    made: bool


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(path: Path, data: bytes, private: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)  # no half-written file if we are interrupted


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _load(cert_path: Path, key_path: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """A certificate and its key, or None when either is missing or unreadable."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return None
    return (cert, key) if isinstance(key, ec.EllipticCurvePrivateKey) else None


def certificate_uris(cert: x509.Certificate) -> list[str]:
    """The SAN URIs of a certificate (its overlay identities, rule 2)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return san.get_values_for_type(x509.UniformResourceIdentifier)


def _san(uri: str, hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri)]
    for host in dict.fromkeys(hosts):  # in order, once each
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _hosts(host: str) -> list[str]:
    extra = [] if host in WILDCARD_HOSTS else [host]
    return [*LOCAL_NAMES, *LOCAL_ADDRESSES, *extra]


def _key_usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not ca,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _make_ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little behind still accept it
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _make_leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], common_name: str, san: x509.SubjectAlternativeName
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(san, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _still_good(
    found: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    ca: x509.Certificate,
    san: x509.SubjectAlternativeName,
) -> bool:
    """Rule 3 for one leaf certificate."""
    if found is None:
        return False
    cert, key = found
    if cert.public_key() != key.public_key() or cert.issuer != ca.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    if cert.not_valid_after_utc - _now() < datetime.timedelta(days=RENEW_DAYS):
        return False
    try:
        have = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return set(have) == set(san)


def make_dev_certs(
    directory: str | os.PathLike[str],
    nodes: Sequence[tuple[int, str]],
    clients: Sequence[str] = ("client",),
    *,
    ca_name: str = "overlay development CA",
) -> list[Made]:
    """Rules 1–4: the CA, ``nodes`` (``(id, host)``) and ``clients`` in ``directory``; what was made or kept."""
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise CertError(f"{out} is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CertError(f"cannot create the directory {out}: {exc.strerror or exc}") from exc
    for name in clients:
        if not name or "/" in name or name.startswith((".", "node-")) or name == "ca":
            raise CertError(f"{name!r} cannot name a client: it would be a file name next to the CA's and nodes'")
    done: list[Made] = []
    ca_pem, ca_key = out / "ca.pem", out / "ca.key"
    ca = _load(ca_pem, ca_key)
    if ca is None and ca_pem.exists() and not ca_key.exists():
        raise CertError(
            f"{ca_pem} exists without its key {ca_key}, so it cannot sign certificates: remove {ca_pem} "
            "to make a new CA (every certificate of the directory is then made again), or put its key beside it"
        )
    if ca is not None and ca[0].not_valid_after_utc - _now() < datetime.timedelta(days=RENEW_DAYS):
        ca = None  # rule 3: a CA near its end is replaced, with everything it signed
    try:
        if ca is None:
            ca = _make_ca(ca_name)
            _write(ca_key, _key_pem(ca[1]), private=True)
            _write(ca_pem, ca[0].public_bytes(serialization.Encoding.PEM), private=False)
            done += [Made(ca_pem, True), Made(ca_key, True)]
        else:
            done += [Made(ca_pem, False), Made(ca_key, False)]
        leaves = [(f"node-{i}", f"overlay node {i}", _san(node_uri(i), _hosts(host))) for i, host in nodes]
        leaves += [(name, f"overlay client {name}", _san(client_uri(name), [])) for name in clients]
        for stem, common_name, san in leaves:
            pem, key = out / f"{stem}.pem", out / f"{stem}.key"
            if _still_good(_load(pem, key), ca[0], san):
                done += [Made(pem, False), Made(key, False)]
                continue
            cert, private = _make_leaf(ca, common_name, san)
            _write(key, _key_pem(private), private=True)
            _write(pem, cert.public_bytes(serialization.Encoding.PEM), private=False)
            done += [Made(pem, True), Made(key, True)]
    except OSError as exc:
        raise CertError(f"cannot write in {out}: {exc.strerror or exc}") from exc
    return done


def tls_table(directory: str, client: str = "client") -> str:
    """The ``[tls]`` table naming the files of ``make_dev_certs`` (rule 1)."""
    d = directory.rstrip("/") or "."
    return "\n".join(
        [
            "[tls]",
            f'ca = "{d}/ca.pem"',
            f'cert = "{d}/node-{{id}}.pem"',
            f'key = "{d}/node-{{id}}.key"',
            f'client_cert = "{d}/{client}.pem"',
            f'client_key = "{d}/{client}.key"',
        ]
    )
