"""``overlay status``: the cluster at a glance, from every node's admin
endpoint (or, for a node without an admin port, the client protocol's
``status`` command).  Exits 1 when a node does not answer."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from ssl import SSLContext
from typing import Any, Final

import aiohttp

from overlay.auth.keys import local_token
from overlay.cli.args import add_command, admin_url, cluster_tls, http_connector, user_token
from overlay.cli.running import CLOSE_TIMEOUT, EXIT_FAILED, EXIT_OK, finish_within, run_command
from overlay.client import Client
from overlay.config import ClusterConfig, NodeConfig, load_config
from overlay.errors import OverlayError, TlsError

__all__ = ["cmd_status", "format_status", "node_statuses", "register", "statuses"]

EXAMPLES: Final = """\
examples:
  overlay status --config cluster_configs/local.toml

Exits 1 when a node does not answer; Ctrl-C ends it within 2 s (exit 130)."""

# How long `overlay status` waits for one node's admin endpoint: a node that
# takes longer is as good as down to an operator looking at the table.
STATUS_TIMEOUT: Final = 3.0


async def _client_status(n: NodeConfig, token: str, tls: SSLContext | None) -> tuple[dict[str, Any] | None, str]:
    """A node without an admin port in the config (0: ephemeral) is asked over
    the client protocol instead (with ``[auth]``, under a token of its own)."""
    c = Client([(n.host, n.port)], client_id="overlay-status", reconnect=False, token=token, ssl=tls)
    try:
        await c.connect(timeout=2)
        return await c.admin("status", timeout=5), ""
    except TlsError as exc:
        return None, f"TLS failed: {exc}"
    except (OSError, OverlayError, TimeoutError) as exc:
        return None, f"down: {n.host}:{n.port} does not answer ({type(exc).__name__})"
    finally:
        await finish_within(c.close(), CLOSE_TIMEOUT, f"closing {n.host}:{n.port}")


async def _http_status(
    http: aiohttp.ClientSession, n: NodeConfig, cfg: ClusterConfig
) -> tuple[dict[str, Any] | None, str]:
    url = admin_url(n.host, n.admin_port, cfg)
    try:
        async with http.get(f"{url}/status") as resp:
            if resp.status != 200:
                return None, f"{url} answered HTTP {resp.status}"
            return await resp.json(), ""
    except aiohttp.ClientConnectorCertificateError as exc:
        return None, f"{url}: its certificate does not verify against the cluster CA ({exc.certificate_error})"
    except aiohttp.ClientConnectorSSLError as exc:
        return None, f"{url}: TLS failed ({exc}): is the cluster insecure, or this config's [tls] another cluster's?"
    except aiohttp.ClientConnectorError:
        return None, f"down: nothing listens on {url}"
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return None, f"down: {url} did not answer ({type(exc).__name__})"


async def node_statuses(cfg: ClusterConfig) -> list[tuple[dict[str, Any] | None, str]]:
    """Every node's ``/status`` from its admin endpoint, or why there is none."""
    token = ""
    if any(not n.admin_port for n in cfg.nodes):  # asked over the client protocol: a Hello needs a token
        token = user_token(None, cfg) or (
            local_token(cfg, "overlay-status", "subscribe") if cfg.auth.signing_key else ""
        )
    tls = cluster_tls(cfg)
    timeout = aiohttp.ClientTimeout(total=STATUS_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout, connector=http_connector(tls)) as http:
        return list(
            await asyncio.gather(
                *(_http_status(http, n, cfg) if n.admin_port else _client_status(n, token, tls) for n in cfg.nodes)
            )
        )


async def statuses(cfg: ClusterConfig) -> list[dict[str, Any] | None]:
    """Every node's ``/status``, ``None`` for a node that does not answer."""
    return [st for st, _ in await node_statuses(cfg)]


def _level_bar(x: float, top: float, width: int = 10) -> str:
    filled = min(width, round(width * x / top)) if top > 0 else 0
    return "█" * filled + "·" * (width - filled)


def format_status(
    cfg: ClusterConfig, statuses: Sequence[dict[str, Any] | None], reasons: Sequence[str] | None = None
) -> str:
    """One line per node (state, load level dc, channels, S/dc̄ as it sees it),
    a cluster line, then the routing table."""
    reasons = list(reasons or [""] * len(statuses))
    levels = [st["dc"] for st in statuses if st]
    top = max(levels, default=0.0)
    rows = [f"{'node':>4}  {'admin':<22} {'state':<11} {'load level dc':<21} {'channels':>8} {'subs':>6} {'S/dc̄':>6}"]
    for n, st, why in zip(cfg.nodes, statuses, reasons):
        where = admin_url(n.host, n.admin_port, cfg) if n.admin_port else f"{n.host}:{n.port}"
        if st is None:
            rows.append(f"{n.id:>4}  {where:<22} {why or 'down'}")
            continue
        ratio = st.get("spread_ratio")
        if ratio is None and st.get("spread") is not None and st.get("mean_dc"):
            ratio = st["spread"] / st["mean_dc"]
        subs = st.get("subscriptions", sum(c.get("subscriptions", 0) for c in st["channels"]))
        rows.append(
            f"{n.id:>4}  {where:<22} {st['state']:<11} {_level_bar(st['dc'], top)} {st['dc']:>10.1f} "
            f"{len(st['channels']):>8} {subs:>6} {'–' if ratio is None else f'{ratio:.3f}':>6}"
        )
    up = [st for st in statuses if st]
    line = f"cluster {cfg.cluster.name!r}: {len(up)}/{len(statuses)} nodes answer"
    if up:
        mean = sum(levels) / len(levels)
        spread = (sum((x - mean) ** 2 for x in levels) / len(levels)) ** 0.5
        line += f", {len(up[0]['routing'])} channels, dc̄ {mean:.1f}, S/dc̄ {spread / mean if mean else 0.0:.3f}"
    rows.append(line)
    if up:
        rows.append("routing table:")
        for r in up[0]["routing"]:
            rows.append(f"  {r['id']:<8} node {','.join(map(str, r['owners'])):<6} {r['space']}")
    return "\n".join(rows)


async def _status(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    answers = await node_statuses(cfg)
    print(format_status(cfg, [st for st, _ in answers], [why for _, why in answers]))
    return EXIT_OK if all(st for st, _ in answers) else EXIT_FAILED


def cmd_status(args: argparse.Namespace) -> int:
    cluster_tls(load_config(args.config))  # rule 1: the certificates too, before connecting
    return run_command(_status(args))


def register(sub: Any) -> None:
    """The ``status`` subcommand."""
    st = add_command(sub, "status", "show the cluster", EXAMPLES)
    st.add_argument("--config", required=True)
    st.set_defaults(func=cmd_status)
