"""overlay.config: a cluster file is checked when loaded (its rules 1–3).

Each case is ``local.toml`` with one mistake; the error must name the key (or
table) and, for a misspelt name, the closest known one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from overlay.config import load_config
from overlay.errors import ConfigError

pytestmark = pytest.mark.timeout(30)

CONFIGS = Path(__file__).resolve().parent.parent / "cluster_configs"
LOCAL = (CONFIGS / "local.toml").read_text()


def load_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    load_config(path)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_the_shipped_configs_load(path: Path) -> None:
    assert load_config(path).nodes


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        # Rule 1: unknown names, with the closest known one.
        ("[bandwidth]", "[bandwith]", "unknown table 'bandwith'; did you mean 'bandwidth'?"),
        ("slice_seconds", "slice_secnds", "unknown key 'slice_secnds' in [cluster]; did you mean 'slice_seconds'?"),
        ("capacity = 1.0", "capacty = 1.0", "unknown key 'capacty' in [[nodes]] #1 (id 0); did you mean 'capacity'?"),
        ('type = "float"', 'typ = "float"', "unknown key 'typ' in [schema] attributes #1; did you mean 'type'?"),
        ("[cluster]", "[agent]\nwindw = 4\n\n[cluster]", "unknown key 'windw' in [agent]; did you mean 'window'?"),
        ("[cluster]", "[sequencer]\nhold_tl = 1\n\n[cluster]", "did you mean 'hold_ttl'?"),
        ("[cluster]", "[zzz]\n\n[cluster]", "unknown table 'zzz'; known: cluster"),
        # Rule 2: not finite, or past a bound: the key is named.
        (
            "probability = 0.5",
            "probability = 0.5\npeer_timeout = inf",
            "[cluster] peer_timeout = inf is not a finite number",
        ),
        ("slice_seconds = 2.0", "slice_seconds = nan", "[cluster] slice_seconds = nan is not a finite number"),
        ("max = 1000 }", "max = -inf }", "[schema] attributes #1 max = -inf is not a finite number"),
        ("capacity = 1.0", "capacity = 1e308", "[[nodes]] #1 (id 0) capacity: Expected `float` <= 1000000.0"),
        ("default = 100.0", "default = 1e300", "[bandwidth] default"),
        ("slice_seconds = 2.0", "slice_seconds = 1e9", "[cluster] slice_seconds"),
        ("probability = 0.5", "probability = 0.5\npeer_queue = 1000000000000", "[cluster] peer_queue"),
        ("[cluster]", "[agent]\nwindow = 1\n\n[cluster]", "[agent] window: Expected `int` >= 2"),
        # Payloads: at most half a frame; absurd sizes refused by their bound.
        (
            "probability = 0.5",
            "probability = 0.5\nmax_payload = 600000",
            "[cluster] max_payload = 600000 must be at most half of max_frame_size = 1048576 (so 524288)",
        ),
        ("probability = 0.5", "probability = 0.5\nmax_payload = -1", "[cluster] max_payload"),
        ("probability = 0.5", "probability = 0.5\nmax_payload = 1e308", "[cluster] max_payload"),
        ("probability = 0.5", "probability = 0.5\noutbox_bytes = 10", "[cluster] outbox_bytes"),
        # The schema's own checks: the file and the key path too.
        ('type = "float"', 'type = "flt"', "[schema] attributes #1: attribute 'price': type must be one of"),
        ("min = 0, max = 100000", 'min = "a", max = 100000', "[schema] attributes #3: attribute 'qty': min must be a"),
        ("min = 0, max = 1000 }", "min = 10, max = 1 }", "[schema] attributes #1: attribute 'price': min 10 is above"),
        ('{ name = "sym"', '{ name = "price"', "[schema] attribute 'price' is declared twice"),
        (
            'distinguishing = ["price", "sym"]',
            'distinguishing = ["prize"]',
            "[schema] distinguishing attribute 'prize'",
        ),
        ('distinguishing = ["price", "sym"]', 'distinguishing = "price"', "[schema] distinguishing must be a list"),
        # Rule 3: an empty host listened on every interface, unsaid.
        ('host = "127.0.0.1"', 'host = ""', "[[nodes]] #1 (id 0) host is empty: give the address the other nodes"),
        ('host = "127.0.0.1"', 'host = " "', '"0.0.0.0" (or "::") listens on every interface'),
        # Rule 3: two sockets on one host:port.
        ("port = 7101", "port = 7100", "node 1's port 127.0.0.1:7100 is node 0's port too"),
        ("admin_port = 8102", "admin_port = 7101", "node 2's admin_port 127.0.0.1:7101 is node 1's port too"),
        ("admin_port = 8101", "admin_port = 7101", "node 1's admin_port 127.0.0.1:7101 is node 1's port too"),
        (
            'host = "127.0.0.1"\nport = 7101',
            'host = "0.0.0.0"\nport = 7100',
            "node 1's port 0.0.0.0:7100 is node 0's port too",
        ),
        # Rule 4: a [tls] table says one thing.
        ('ca = "certs/ca.pem"', 'ca = "certs/ca.pem"\ninsecure = true', "insecure = true turns TLS off, but ca, cert"),
        ('key = "certs/node-{id}.key"\n', "", "[tls] needs ca, cert and key (missing: key)"),
        ('ca = "certs/ca.pem"', 'ca = "certs/ca.pem"\nsecret = "s"', "[tls] secret is for insecure = true"),
        ('client_key = "certs/client.key"', "", "client_cert and client_key go together"),
        ('ca = "certs/ca.pem"', 'ca = "certs/ca.pem"\nverify_client = true', "did you mean 'verify_clients'?"),
    ],
)
def test_a_mistake_is_named(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in LOCAL
    with pytest.raises(ConfigError) as err:
        load_text(tmp_path, LOCAL.replace(old, new, 1))
    assert message in str(err.value)
    assert str(err.value).startswith(str(tmp_path / "c.toml"))


def test_ports_on_other_hosts_or_ephemeral_do_not_clash(tmp_path: Path) -> None:
    text = LOCAL.replace('host = "127.0.0.1"\nport = 7101', 'host = "127.0.0.2"\nport = 7100', 1)
    text = text.replace("admin_port = 8100", "admin_port = 0").replace("admin_port = 8101", "admin_port = 0")
    load_text(tmp_path, text)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*nope.toml does not exist"):
        load_config(tmp_path / "nope.toml")


def test_a_node_checks_the_agent_table_without_importing_the_client_library(tmp_path: Path) -> None:
    """``[agent]`` (``AgentSettings``, ``load_agent_settings``) belongs to this
    module; the client imports it from here, never the other way round."""
    path = tmp_path / "c.toml"
    path.write_text(LOCAL + "\n[agent]\nwindow = 8\n")
    code = (
        "import sys; from overlay.config import load_config; load_config(sys.argv[1]); "
        "print(sorted(m for m in sys.modules if m.startswith('overlay.client')))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    from overlay import client, config

    assert client.AgentSettings is config.AgentSettings and client.load_agent_settings is config.load_agent_settings


def test_payload_settings_load_and_a_larger_frame_allows_a_larger_payload(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(LOCAL)
    cfg = load_config(tmp_path / "c.toml")
    assert (cfg.cluster.max_payload, cfg.cluster.capture_payload) == (64 * 1024, False)
    text = LOCAL.replace(
        "probability = 0.5",
        "probability = 0.5\nmax_frame_size = 4194304\nmax_payload = 2097152\ncapture_payload = true",
        1,
    )
    (tmp_path / "c.toml").write_text(text)
    cfg = load_config(tmp_path / "c.toml")
    assert (cfg.cluster.max_payload, cfg.cluster.capture_payload) == (2 << 20, True)
