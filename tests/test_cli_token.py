"""``overlay token create|verify|keys`` (``overlay.cli.token``): what a user
types, what it prints, and a one-line error with exit 2 for every mistake."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import CONFIGS
from overlay import cli
from overlay.auth import load_public_key
from overlay.auth.tokens import Verifier
from overlay.config import load_config

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    """local.toml with an [auth] table and its key pair beside it."""
    assert cli.main(["token", "keys", str(tmp_path / "keys")]) == 0
    path = tmp_path / "local.toml"
    shutil.copy(CONFIGS / "local.toml", path)
    with path.open("a") as fh:
        fh.write('\n[auth]\npublic_keys = ["keys/auth.pub"]\nsigning_key = "keys/auth.key"\n')
    return path


def test_create_prints_the_token_alone_and_verify_reads_it(cfg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    argv = ["token", "create", "--config", str(cfg), "--role", "subscribe", "--role", "publish"]
    assert cli.main([*argv, "--scope", 'subscribe=sym prefix "AB"', "--subject", "alice", "--ttl", "8h"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert token.count(".") == 2 and "\n" not in token
    assert "subject 'alice', roles publish, subscribe" in err and 'subscribe within `sym prefix "AB"`' in err
    c = load_config(cfg)
    rights = Verifier([load_public_key(c.auth.public_keys[0])], audience="local", schema=c.schema).verify(token, 0)
    assert rights.subject == "alice" and rights.expires > 8 * 3600
    assert cli.main(["token", "verify", "--config", str(cfg), token]) == 0
    assert "valid on cluster 'local'" in capsys.readouterr().out


def test_create_with_limits_puts_them_in_the_token(cfg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    argv = ["token", "create", "--config", str(cfg), "--role", "subscribe", "--subject", "big"]
    assert cli.main([*argv, "--limit", "max_subscriptions=50000", "--limit", "publish_rate=2.5"]) == 0
    out, err = capsys.readouterr()
    assert "limits: max_subscriptions = 50000, publish_rate = 2.5" in err
    c = load_config(cfg)
    rights = Verifier([load_public_key(c.auth.public_keys[0])], audience="local", schema=c.schema).verify(
        out.strip(), 0
    )
    assert rights.limits == {"max_subscriptions": 50_000, "publish_rate": 2.5}


def test_verify_says_why_a_token_is_refused(cfg: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["token", "keys", str(tmp_path / "other")]) == 0
    argv = ["token", "create", "--config", str(cfg), "--role", "admin"]
    capsys.readouterr()
    assert cli.main([*argv, "--key", str(tmp_path / "other/auth.key")]) == 2  # a key the nodes do not trust
    assert "is not one the nodes of" in capsys.readouterr().err
    assert cli.main(["token", "verify", "--config", str(cfg), "garbage"]) == 1
    assert "refused: the token is not a JWT" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--role", "root"], "unknown role 'root'"),
        (["--role", "publish", "--scope", "publish=venue = lse"], "at position 8"),
        (["--role", "publish", "--scope", 'subscribe=sym = "A"'], "needs the subscribe role"),
        (["--role", "admin", "--scope", 'admin=sym = "A"'], "takes no content scope"),
        (["--role", "publish", "--scope", "nonsense"], "ROLE=EXPRESSION"),
        (["--role", "publish", "--scope", "publish=qty > 1", "--scope", "publish=qty < 9"], "given twice"),
        (["--role", "publish", "--ttl", "400d"], "max_ttl = 30d"),
        (["--role", "publish", "--ttl", "5x"], "not a duration"),
        (["--role", "publish", "--subject", "two words"], "subject"),
        (["--role", "publish", "--subject", ""], "argument --subject: an empty subject: give the client id"),
        (["--role", "publish", "--key", "/nonexistent/auth.key"], "does not exist"),
        (["--role", "publish", "--limit", "max_clients=5"], "unknown limit 'max_clients'"),
        (["--role", "publish", "--limit", "publish_rate"], "KEY=NUMBER"),
        ([], "--role"),
    ],
)
def test_create_refuses_bad_arguments_in_one_line(
    cfg: Path, extra: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    try:
        code = cli.main(["token", "create", "--config", str(cfg), *extra])
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert code == 2 and not out and words in err, err
    assert err.startswith("overlay")


def test_create_without_auth_in_the_config_says_what_to_add(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["token", "create", "--config", str(CONFIGS / "local.toml"), "--role", "admin"]) == 2
    assert "has no [auth] table" in capsys.readouterr().err


def test_keys_keep_an_existing_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["token", "keys", str(tmp_path)]) == 0
    assert "[auth]" in capsys.readouterr().out
    assert cli.main(["token", "keys", str(tmp_path)]) == 2
    assert "exists already" in capsys.readouterr().err
    assert cli.main(["token", "keys", str(tmp_path), "--force"]) == 0
