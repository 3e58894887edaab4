"""overlay.security.tls and .identity: a config's ``[tls]`` into contexts, and who a certificate names.

Every problem with the files is a ``ConfigError`` naming the key, the path
and what to do (``tls`` rule 4); insecure clusters need a long enough
secret (rule 5); paths are relative to the config (rule 6); identities are
read from SAN URIs only, strictly.
"""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import msgspec
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from conftest import LOCAL
from overlay.config import ClusterConfig, TlsSettings
from overlay.errors import ConfigError
from overlay.security import SECRET_ENV, client_ssl, identity_of, node_security, tls_path
from overlay.security.certs import make_dev_certs
from overlay.security.identity import Identity, identity_from_uris

SECRET = "a secret of more than sixteen characters"


def with_tls(tls: TlsSettings, path: str = "") -> ClusterConfig:
    return msgspec.structs.replace(LOCAL, tls=tls, path=path or LOCAL.path)


def dev(directory: Path, **more: object) -> TlsSettings:
    make_dev_certs(directory, [(n.id, n.host) for n in LOCAL.nodes])
    return TlsSettings(
        ca=str(directory / "ca.pem"),
        cert=str(directory / "node-{id}.pem"),
        key=str(directory / "node-{id}.key"),
        **more,  # type: ignore[arg-type]
    )


# -- identities --------------------------------------------------------------------------------


def test_identities_come_from_san_uris_strictly() -> None:
    ident = identity_from_uris(["overlay://node/3", "overlay://client/alice", "https://example.com"])
    assert (ident.node, ident.clients) == (3, frozenset({"alice"}))
    assert identity_from_uris(["overlay://node/1", "overlay://node/2"]).node is None  # ambiguous
    for uri in ["overlay://node/01", "overlay://node/-1", "overlay://node/١", "overlay://node/1x", "overlay://node/"]:
        assert identity_from_uris([uri]).nodes == frozenset(), uri
    assert identity_from_uris(["overlay://client/"]).clients == frozenset()


def test_identity_of_a_verified_certificate() -> None:
    peercert = {"subjectAltName": (("DNS", "localhost"), ("URI", "overlay://node/7"))}
    assert identity_of(peercert) == Identity(frozenset({7}), frozenset(), certified=True)
    assert identity_of(None) == Identity() and not identity_of({}).certified
    assert identity_of({"subject": ()}).certified  # a certificate naming no overlay identity
    assert identity_of({"subject": ()}).describe() == "no overlay identity"


# -- node contexts -------------------------------------------------------------------------------


def test_a_node_gets_contexts_for_its_port_links_and_admin_port(tmp_path: Path) -> None:
    sec = node_security(with_tls(dev(tmp_path)), 1)
    assert not sec.insecure and sec.scheme == "https" and not sec.secret
    assert sec.server is not None and sec.server.verify_mode == ssl.CERT_OPTIONAL
    assert sec.dial is not None and sec.dial.verify_mode == ssl.CERT_REQUIRED and not sec.dial.check_hostname
    assert sec.admin is not None and sec.admin.verify_mode == ssl.CERT_NONE
    assert sec.http is not None and sec.http.check_hostname
    assert node_security(with_tls(dev(tmp_path, verify_clients=True)), 1).verify_clients


def test_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    make_dev_certs(tmp_path / "certs", [(0, "127.0.0.1")])
    cfg = with_tls(TlsSettings(ca="certs/ca.pem", cert="certs/node-{id}.pem", key="certs/node-{id}.key"))
    cfg = msgspec.structs.replace(cfg, path=str(tmp_path / "cluster.toml"))
    assert tls_path(cfg, cfg.tls.cert, 0) == tmp_path / "certs" / "node-0.pem"
    assert not node_security(cfg, 0).insecure


def test_a_config_without_tls_starts_nothing() -> None:
    with pytest.raises(ConfigError, match=r"no \[tls\] table.*overlay certs dev.*insecure = true"):
        node_security(with_tls(TlsSettings()), 0)
    with pytest.raises(ConfigError, match=r"no \[tls\] table"):
        client_ssl(with_tls(TlsSettings()))


@pytest.mark.parametrize("missing", ["ca", "cert", "key"])
def test_a_missing_file_is_named_with_what_to_do(tmp_path: Path, missing: str) -> None:
    tls = dev(tmp_path)
    path = tls_path(with_tls(tls), getattr(tls, missing), 0)
    path.unlink()
    with pytest.raises(ConfigError) as err:
        node_security(with_tls(tls), 0)
    assert f"[tls] {missing}: {path} does not exist" in str(err.value)
    assert "overlay certs dev" in str(err.value)


def test_a_key_that_is_not_the_certificates_is_refused(tmp_path: Path) -> None:
    tls = dev(tmp_path)
    (tmp_path / "node-0.key").write_bytes((tmp_path / "node-1.key").read_bytes())
    with pytest.raises(ConfigError, match=r"\[tls\] cert/key: .* are not a PEM certificate and its own private key"):
        node_security(with_tls(tls), 0)


def test_a_ca_file_that_is_not_a_certificate_is_refused(tmp_path: Path) -> None:
    tls = dev(tmp_path)
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"\[tls\] ca: .* holds no PEM certificate"):
        client_ssl(with_tls(tls))


def test_a_node_certificate_must_name_its_node(tmp_path: Path) -> None:
    tls = msgspec.structs.replace(dev(tmp_path), cert=str(tmp_path / "node-2.pem"), key=str(tmp_path / "node-2.key"))
    with pytest.raises(ConfigError, match="names overlay://node/2, not overlay://node/0: peers would refuse"):
        node_security(with_tls(tls), 0)


def test_an_expired_node_certificate_is_refused(tmp_path: Path) -> None:
    tls = dev(tmp_path)
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((tmp_path / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    past = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    old = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node 0")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(past)
        .not_valid_after(past + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier("overlay://node/0")]), False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    (tmp_path / "node-0.pem").write_bytes(old.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "node-0.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    with pytest.raises(ConfigError, match="is valid from 2020-01-01 to 2020-01-02, not now"):
        node_security(with_tls(tls), 0)


# -- insecure: the secret ------------------------------------------------------------------------


def test_insecure_needs_a_long_enough_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"needs the cluster secret.*OVERLAY_CLUSTER_SECRET"):
        node_security(with_tls(TlsSettings(insecure=True)), 0)
    with pytest.raises(ConfigError, match="has 5 characters; at least 16"):
        node_security(with_tls(TlsSettings(insecure=True, secret="short")), 0)
    sec = node_security(with_tls(TlsSettings(insecure=True, secret=SECRET)), 0)
    assert sec.insecure and sec.secret == SECRET.encode() and sec.scheme == "http"
    assert client_ssl(with_tls(TlsSettings(insecure=True, secret=SECRET))) is None


def test_the_environment_secret_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "from the environment, long enough")
    sec = node_security(with_tls(TlsSettings(insecure=True)), 0)
    assert sec.secret == b"from the environment, long enough"
