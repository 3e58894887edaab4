"""overlay.security.certs and ``overlay certs dev``: development certificates (SPEC §16).

What each certificate names (its identity URI, its addresses), that the
files verify with the standard ``ssl`` module, that a second run keeps what
is right and makes what is missing or wrong, and the command's one-line
refusals.
"""

from __future__ import annotations

import os
import re
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from overlay import cli
from overlay.security.certs import CertError, certificate_uris, make_dev_certs, tls_table
from overlay.security.identity import identity_from_uris

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / "cluster_configs" / "local.toml"


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def san(path: Path) -> set[str]:
    ext = cert(path).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(getattr(n, "value", n)) for n in ext}


def test_a_ca_one_certificate_per_node_and_a_client(tmp_path: Path) -> None:
    made = make_dev_certs(tmp_path, [(0, "127.0.0.1"), (1, "10.1.2.3"), (2, "node2.example"), (3, "0.0.0.0")])
    names = {m.path.name for m in made}
    assert names == {"ca.pem", "ca.key", "client.pem", "client.key"} | {
        f"node-{i}.{ext}" for i in range(4) for ext in ("pem", "key")
    }
    assert all(m.made for m in made)
    assert identity_from_uris(certificate_uris(cert(tmp_path / "node-1.pem"))).node == 1
    assert identity_from_uris(certificate_uris(cert(tmp_path / "client.pem"))).clients == {"client"}
    assert san(tmp_path / "node-1.pem") == {"overlay://node/1", "localhost", "127.0.0.1", "::1", "10.1.2.3"}
    assert "node2.example" in san(tmp_path / "node-2.pem")
    assert "0.0.0.0" not in san(tmp_path / "node-3.pem")  # a wildcard is no address to reach
    for key in tmp_path.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_the_files_work_with_the_standard_ssl_module(tmp_path: Path) -> None:
    make_dev_certs(tmp_path, [(0, "127.0.0.1")])
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "node-0.pem", tmp_path / "node-0.key")
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(tmp_path / "ca.pem")
    client.load_cert_chain(tmp_path / "client.pem", tmp_path / "client.key")
    # openssl agrees the node's certificate is the CA's (when openssl is installed).
    proc = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"), str(tmp_path / "node-0.pem")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_a_second_run_keeps_what_is_right_and_makes_what_is_missing(tmp_path: Path) -> None:
    make_dev_certs(tmp_path, [(0, "127.0.0.1")])
    before = (tmp_path / "node-0.pem").read_bytes()
    again = make_dev_certs(tmp_path, [(0, "127.0.0.1"), (1, "127.0.0.1")])
    made = {m.path.name for m in again if m.made}
    assert made == {"node-1.pem", "node-1.key"}
    assert (tmp_path / "node-0.pem").read_bytes() == before
    # A node whose host changed, and a certificate whose key went missing: made again.
    (tmp_path / "client.key").unlink()
    third = make_dev_certs(tmp_path, [(0, "10.9.9.9"), (1, "127.0.0.1")])
    assert {m.path.name for m in third if m.made} == {"node-0.pem", "node-0.key", "client.pem", "client.key"}


def test_a_new_ca_remakes_every_certificate(tmp_path: Path) -> None:
    make_dev_certs(tmp_path, [(0, "127.0.0.1")])
    (tmp_path / "ca.pem").unlink()
    (tmp_path / "ca.key").unlink()
    again = make_dev_certs(tmp_path, [(0, "127.0.0.1")])
    assert all(m.made for m in again)
    cert(tmp_path / "node-0.pem").verify_directly_issued_by(cert(tmp_path / "ca.pem"))


def test_a_ca_without_its_key_cannot_sign(tmp_path: Path) -> None:
    make_dev_certs(tmp_path, [])
    (tmp_path / "ca.key").unlink()
    with pytest.raises(CertError, match="exists without its key"):
        make_dev_certs(tmp_path, [(0, "127.0.0.1")])


@pytest.mark.parametrize("name", ["", "ca", "node-1", "../x", ".hidden"])
def test_client_names_that_would_clash_with_files_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(CertError, match="cannot name a client"):
        make_dev_certs(tmp_path, [], clients=[name])


def test_the_tls_table_names_the_files() -> None:
    assert tls_table("certs/") == "\n".join(
        [
            "[tls]",
            'ca = "certs/ca.pem"',
            'cert = "certs/node-{id}.pem"',
            'key = "certs/node-{id}.key"',
            'client_cert = "certs/client.pem"',
            'client_key = "certs/client.key"',
        ]
    )


# -- overlay certs dev ------------------------------------------------------------------------


def test_the_command_makes_them_for_a_config_and_says_which_tls_table_uses_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "local.toml"
    config.write_text(LOCAL.read_text())  # its [tls] names certs/ beside it
    assert cli.main(["certs", "dev", str(tmp_path / "certs"), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "made ca.pem, ca.key, node-0.pem" in out and "uses them" in out
    assert cli.main(["certs", "dev", str(tmp_path / "elsewhere"), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "its [tls] table" in out and 'ca = "elsewhere/ca.pem"' in out
    assert cli.main(["certs", "dev", str(tmp_path / "certs"), "--config", str(config)]) == 0
    assert "made nothing" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["certs", "dev", "{file}", "--config", str(LOCAL)], "not a directory"),
        (["certs", "dev", "{tmp}/x", "--config", "{tmp}/missing.toml"], "does not exist"),
        (["certs", "dev", "{tmp}/x"], "--config"),
        (["certs", "make", "{tmp}/x", "--config", str(LOCAL)], "invalid choice"),
        (["certs", "dev", "{tmp}/x", "--config", str(LOCAL), "--client", "ca"], "cannot name a client"),
    ],
    ids=["dir-is-a-file", "no-config-file", "no-config", "unknown-action", "bad-client-name"],
)
def test_the_command_refuses_bad_arguments_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], word: str
) -> None:
    file = tmp_path / "a-file"
    file.write_text("")
    argv = [a.replace("{file}", str(file)).replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and word in err, err


def test_a_node_without_its_certificate_says_so_in_one_line(tmp_path: Path) -> None:
    # local.toml as a user copies it, without running `overlay certs dev` first
    # (on ephemeral ports: tests never take fixed ones).
    config = tmp_path / "local.toml"
    config.write_text(re.sub(r"(?m)^(admin_)?port = \d+$", r"\1port = 0", LOCAL.read_text()))
    proc = subprocess.run(
        [sys.executable, "-m", "overlay", "node", "--config", str(config), "--id", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"[tls] ca: {tmp_path / 'certs' / 'ca.pem'} does not exist" in proc.stderr
    assert "overlay certs dev" in proc.stderr
