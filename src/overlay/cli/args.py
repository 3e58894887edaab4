"""Checking the command line and the config (rule 1 of ``overlay.cli``).

Every argparse ``type=`` of every command is one of the validators here, so a
number is refused the same way wherever it is given (not a number, not
finite, not positive); ``config_node`` and ``check_dir_option`` check what a
command names before anything starts or connects.  ``Parser`` puts
argparse's own errors on one line, with exit code 2.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from ssl import SSLContext
from typing import Any, NoReturn

import aiohttp

from overlay.auth.tokens import unverified_subject
from overlay.cli.running import EXIT_USAGE, UsageError
from overlay.config import ClusterConfig, NodeConfig
from overlay.security import client_ssl

__all__ = [
    "TOKEN_ENV",
    "Parser",
    "add_command",
    "addresses",
    "admin_url",
    "check_dir_option",
    "client_id_for",
    "cluster_tls",
    "config_node",
    "http_connector",
    "integer",
    "node_id",
    "non_negative_float",
    "number",
    "positive_float",
    "positive_int",
    "user_token",
]

# The environment variable client commands take a token from (``--token`` wins).
TOKEN_ENV = "OVERLAY_TOKEN"
# The legacy admin token's, for a cluster without [auth].
ADMIN_TOKEN_ENV = "OVERLAY_ADMIN_TOKEN"


def number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_float(text: str) -> float:
    value = number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def sequence_key(text: str) -> str:
    """``pub --key``: an empty key would publish unordered, which the flag never asks for."""
    if not text:
        raise argparse.ArgumentTypeError("a sequence key must not be empty (leave --key out for unordered events)")
    return text


def group_name(text: str) -> str:
    """``sub --group``: a blank name would subscribe outside any group (an empty one) or be
    refused by the node (bad_group) only after connecting."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a group name must not be blank (leave --group out for a plain subscription)")
    return text


def node_id(text: str) -> int:
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"node ids are not negative, got {value}")
    return value


def config_node(cfg: ClusterConfig, wanted: int, flag: str = "--node") -> NodeConfig:
    """Node ``wanted`` of the config, or a ``UsageError`` naming the nodes it has."""
    for n in cfg.nodes:
        if n.id == wanted:
            return n
    raise UsageError(
        f"{flag} {wanted}: node {wanted} does not exist in {cfg.path} (its nodes: {', '.join(map(str, cfg.node_ids))})"
    )


def addresses(cfg: ClusterConfig, node: int | None) -> list[tuple[str, int]]:
    """Where a client command connects: node ``node`` (``--node``), or every node."""
    nodes = [config_node(cfg, node)] if node is not None else list(cfg.nodes)
    return [(n.host, n.port) for n in nodes]


def user_token(given: str | None, cfg: ClusterConfig, *, admin: bool = False) -> str:
    """The token a client command presents: ``--token``, else ``$OVERLAY_TOKEN``
    where the cluster has ``[auth]``; without it, an operator command
    (``admin``) presents the legacy admin token (``$OVERLAY_ADMIN_TOKEN``, then
    the config's ``[cluster] admin_token``) and pub/sub none."""
    if given:
        return given
    if cfg.auth.enabled:
        return os.environ.get(TOKEN_ENV, "")
    return (os.environ.get(ADMIN_TOKEN_ENV) or cfg.cluster.admin_token) if admin else ""


def client_id_for(token: str, default: str) -> str | None:
    """A command's client id: None (the library takes the token's subject)
    for a signed token, which names its client; ``default`` otherwise."""
    return None if unverified_subject(token) else default


def check_dir_option(flag: str, path: str | None) -> None:
    """A directory option (``--capture``, ``--out``) names a directory, or
    nothing yet: the command creates it."""
    if path and Path(path).exists() and not Path(path).is_dir():
        raise UsageError(f"{flag} {path}: exists and is not a directory")


def admin_url(host: str, port: int, cfg: ClusterConfig) -> str:
    """The URL of a node's admin endpoint: https unless the cluster is
    insecure; a node listening on every address is reached on loopback."""
    scheme = "http" if cfg.tls.insecure else "https"
    return f"{scheme}://{'127.0.0.1' if host in ('', '0.0.0.0', '::') else host}:{port}"


def cluster_tls(cfg: ClusterConfig) -> SSLContext | None:
    """What a client command connects with (``overlay.security.client_ssl``):
    its CA and certificate from the config's ``[tls]``, None when insecure.
    A missing file is a ``ConfigError`` (exit 2) before anything connects."""
    return client_ssl(cfg)


def http_connector(tls: SSLContext | None) -> aiohttp.TCPConnector:
    """An aiohttp connector for the admin endpoints: their certificates
    verified against the cluster CA (``tls``), or plain HTTP."""
    return aiohttp.TCPConnector(ssl=tls if tls is not None else True)


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (rule 1): the usage it prints first
    is long for commands with many options, and ``--help`` shows it anyway."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def add_command(sub: Any, name: str, help: str, examples: str) -> argparse.ArgumentParser:
    """A subcommand's parser: its help as description, its examples as epilog."""
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=help, epilog=examples, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return p
