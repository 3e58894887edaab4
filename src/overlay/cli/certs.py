"""``overlay certs dev DIR --config F``: development certificates for a config's nodes (SPEC §16).

Makes (or keeps, when still right: ``overlay.security.certs`` rule 3) a
local CA in ``DIR``, a certificate and key per node id of ``F`` — naming
``overlay://node/<id>``, ``localhost``, ``127.0.0.1`` and the node's host —
and one per ``--client`` name, then says what it did and which ``[tls]``
table of ``F`` uses them.  ``make run`` runs it for
``cluster_configs/local.toml`` before the demo.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Final

from overlay.cli.args import add_command
from overlay.cli.running import EXIT_OK, UsageError
from overlay.config import ClusterConfig, load_config
from overlay.security import tls_path

__all__ = ["cmd_certs", "register"]

EXAMPLES: Final = """\
examples:
  overlay certs dev cluster_configs/certs --config cluster_configs/local.toml
  overlay certs dev /etc/overlay/dev --config prod-like.toml --client alice --client bob

Running it again keeps what is still right and makes what is missing (a new
node of the config, a certificate near its end).  Development only: the CA's
key sits beside the certificates."""


def _relative(directory: Path, cfg: ClusterConfig) -> str:
    """``directory`` as the config's ``[tls]`` paths name it: relative to the
    config file's directory (``overlay.security.tls`` rule 6)."""
    base = Path(cfg.path).resolve().parent
    return os.path.relpath(directory.resolve(), base)


def _uses(cfg: ClusterConfig, directory: Path, client: str) -> bool:
    """Whether the config's ``[tls]`` names the files just made."""
    tls = cfg.tls
    if tls.insecure or not tls.ca:
        return False
    d = directory.resolve()
    first = cfg.nodes[0].id
    wanted = {
        tls_path(cfg, tls.ca): d / "ca.pem",
        tls_path(cfg, tls.cert, first): d / f"node-{first}.pem",
        tls_path(cfg, tls.key, first): d / f"node-{first}.key",
    }
    if tls.client_cert:
        wanted[tls_path(cfg, tls.client_cert)] = d / f"{client}.pem"
    return all(have.resolve() == want for have, want in wanted.items())


def cmd_certs(args: argparse.Namespace) -> int:
    # cryptography is loaded by this command only (overlay.security.__init__).
    from overlay.security.certs import CertError, make_dev_certs, tls_table

    cfg = load_config(args.config)
    directory = Path(args.dir)
    clients = args.client or ["client"]
    try:
        made = make_dev_certs(directory, [(n.id, n.host) for n in cfg.nodes], clients)
    except CertError as exc:
        raise UsageError(str(exc)) from None
    new = [m.path.name for m in made if m.made]
    kept = [m.path.name for m in made if not m.made]
    print(f"{directory}: made {', '.join(new) if new else 'nothing'}; kept {', '.join(kept) if kept else 'nothing'}")
    if _uses(cfg, directory, clients[0]):
        print(f"{cfg.path} uses them ([tls]).")
    else:
        print(f"for {cfg.path}, its [tls] table (paths relative to the config file):")
        print(tls_table(_relative(directory, cfg), clients[0]))
    return EXIT_OK


def register(sub: Any) -> None:
    """The ``certs`` subcommand."""
    c = add_command(sub, "certs", "development certificates: a local CA, one per node, one per client", EXAMPLES)
    c.add_argument("action", choices=["dev"])
    c.add_argument("dir", help="where the CA, node and client certificates go (created if needed)")
    c.add_argument("--config", required=True, help="the cluster config whose nodes get a certificate each")
    c.add_argument(
        "--client", action="append", metavar="NAME", help="a client certificate's name (repeatable; default client)"
    )
    c.set_defaults(func=cmd_certs)
