"""``overlay token create|verify|keys``: client tokens (``overlay.auth``).

``create`` signs a token with the ``[auth] signing_key`` of the config (or
``--key``) for the config's cluster and schema, and prints it alone on
stdout (so ``export OVERLAY_TOKEN=$(overlay token create …)`` works); what
it grants goes to stderr.  Everything is checked before signing, each with a
one-line error and exit 2: an unknown role, a scope that is not an
expression of the schema (with its position), a scope for a role the token
lacks, a ttl past ``[auth] max_ttl``, a signing key that is missing or is
not one the cluster's nodes trust, a ``--limit`` that is not one a token may
set (``overlay.limits.settings`` rule 3) or out of its bounds, an empty
``--subject`` (left out, the subject is a new random one).  ``verify`` says
what a token allows on this cluster, or why its nodes would refuse it (exit
1).  ``keys DIR`` makes a key pair for development and prints the
``[auth]`` table to use.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Final

from overlay.auth import generate_keys, issue, key_id, load_signing_key, verifier_for
from overlay.auth.tokens import Rights
from overlay.cli.args import TOKEN_ENV, add_command
from overlay.cli.running import EXIT_FAILED, EXIT_OK, UsageError, one_line
from overlay.config import ClusterConfig, load_config
from overlay.errors import BadScope, TokenError, UnknownRole
from overlay.limits import CLIENT_KEYS

__all__ = ["cmd_create", "cmd_keys", "cmd_verify", "duration", "register"]

EXAMPLES: Final = """\
examples:
  overlay token keys .keys                                  (a key pair; prints the [auth] table)
  overlay token create --config F --role publish --role subscribe --subject pricer --ttl 8h
  overlay token create --config F --role subscribe --scope 'subscribe=sym prefix "AB"' --ttl 30d
  overlay token create --config F --role publish --scope 'publish=venue = "lse"' --subject lse-feed
  overlay token create --config F --role admin --subject ops --ttl 15m
  overlay token create --config F --role subscribe --subject big-desk --limit max_subscriptions=50000
  export OVERLAY_TOKEN=$(overlay token create --config F --role publish --subject me)
  overlay token verify --config F "$OVERLAY_TOKEN"

create prints the token alone on stdout, and what it grants on stderr."""

# --ttl: a number of seconds, or with a unit.
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
DEFAULT_TTL: Final = "1h"


def duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``8h``, ``30d`` → seconds (argparse ``type=``)."""
    m = _DURATION.fullmatch(text.strip())
    if m is None or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: give seconds, or e.g. 90s, 15m, 8h, 30d")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _scope(text: str) -> tuple[str, str]:
    role, sep, expr = text.partition("=")
    if not sep or not role.strip() or not expr.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: a scope is ROLE=EXPRESSION, e.g. 'subscribe=sym prefix \"AB\"'")
    return role.strip(), expr.strip()


def _subject(text: str) -> str:
    # Empty, it made a random subject as if --subject were left out: a token
    # for a client id nobody chose (a script whose variable was unset).
    if not text:
        raise argparse.ArgumentTypeError(
            "an empty subject: give the client id the token is for, or leave --subject out for a random one"
        )
    return text


def _limit(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    try:
        number = float(value) if sep else math.nan
    except ValueError:
        number = math.nan
    if not key.strip() or not math.isfinite(number):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a limit is KEY=NUMBER, e.g. max_subscriptions=50000; keys: {', '.join(CLIENT_KEYS)}"
        )
    return key.strip(), int(number) if number.is_integer() else number


def _span(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        if seconds >= _UNITS[unit]:
            return f"{seconds / _UNITS[unit]:g}{unit}"
    return f"{seconds:g}s"


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _grants(rights: Rights, leeway: float) -> str:
    scopes = "; ".join(f"{role} within `{text}`" for role, text in sorted(rights.scope_text.items()))
    return (
        f"subject {rights.subject!r}, roles {', '.join(sorted(rights.roles))}"
        + (f", scopes: {scopes}" if scopes else ", no scope")
        + (f", limits: {', '.join(f'{k} = {v:g}' for k, v in sorted(rights.limits.items()))}" if rights.limits else "")
        + f"; expires {_when(rights.expires - leeway)}"
    )


def _auth_config(cfg: ClusterConfig) -> None:
    if not cfg.auth.enabled:
        raise UsageError(
            f"{cfg.path} has no [auth] table: its nodes check no token. Add one "
            "(`overlay token keys DIR` prints it) and restart the nodes"
        )


def cmd_create(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    _auth_config(cfg)
    key_path = args.key or cfg.auth.signing_key
    if not key_path:
        raise UsageError(f"{cfg.path} names no [auth] signing_key: add it, or give --key PATH")
    key = load_signing_key(key_path)
    verifier = verifier_for(cfg)
    assert verifier is not None  # _auth_config
    if key_id(key) not in verifier.keys:
        raise UsageError(
            f"signing key {key_path} (id {key_id(key)}) is not one the nodes of {cfg.path} trust "
            f"([auth] public_keys: {', '.join(sorted(verifier.keys))}): they would refuse its tokens"
        )
    if args.ttl > cfg.auth.max_ttl:
        raise UsageError(f"--ttl {_span(args.ttl)} is longer than [auth] max_ttl = {_span(cfg.auth.max_ttl)}")
    scopes: dict[str, str] = {}
    for role, expr in args.scope:
        if role in scopes:
            raise UsageError(f"--scope {role}= given twice: one expression per role (join them with `and`)")
        scopes[role] = expr
    subject = args.subject if args.subject is not None else f"client-{uuid.uuid4().hex[:12]}"
    now = time.time()
    try:
        token = issue(
            key,
            subject=subject,
            roles=args.role,
            scopes=scopes,
            limits=dict(args.limit),
            audience=cfg.cluster.name,
            ttl=args.ttl,
            now=now,
            schema=cfg.schema,
            max_ttl=cfg.auth.max_ttl,
        )
    except BadScope as exc:
        error = UsageError(f"--scope {exc.role}: {exc}")
        if exc.position >= 0:  # the expression with a caret under the offending token
            error.details = [f"  {exc.text}", f"  {' ' * exc.position}^"]  # type: ignore[attr-defined]
        raise error from None
    except (UnknownRole, TokenError) as exc:
        raise UsageError(str(exc)) from None
    print(token, flush=True)
    print(
        f"token for cluster {cfg.cluster.name!r}: {_grants(verifier.verify(token, now), verifier.leeway)}",
        file=sys.stderr,
    )
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    _auth_config(cfg)
    verifier = verifier_for(cfg)
    assert verifier is not None
    token = args.token or _env_token()
    try:
        rights = verifier.verify(token, time.time())
    except TokenError as exc:
        print(f"refused: {one_line(exc)}", file=sys.stderr)
        return EXIT_FAILED
    print(f"valid on cluster {cfg.cluster.name!r}: {_grants(rights, verifier.leeway)}")
    return EXIT_OK


def _env_token() -> str:
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise UsageError(f"which token? give it as an argument, or set {TOKEN_ENV}")
    return token


def cmd_keys(args: argparse.Namespace) -> int:
    private, public = generate_keys(args.dir, overwrite=args.force)
    print(f"wrote {private} (the signing key: keep it secret) and {public}")
    print("add to the cluster's config (paths relative to the config file):")
    print(f'[auth]\npublic_keys = ["{public}"]\nsigning_key = "{private}"')
    print(f"nodes need only {public.name}; `overlay token create` needs {private.name}")
    return EXIT_OK


def register(sub: Any) -> None:
    """The ``token`` subcommand."""
    t = add_command(sub, "token", "client tokens: create one, verify one, make a key pair", EXAMPLES)
    actions = t.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = actions.add_parser(
        "create",
        help="sign a token (printed on stdout)",
        description="sign a token with the config's [auth] signing_key",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("--config", required=True)
    c.add_argument(
        "--role",
        action="append",
        required=True,
        help="publish, subscribe or admin; repeat for several",
    )
    c.add_argument(
        "--scope",
        action="append",
        type=_scope,
        default=[],
        metavar="ROLE=EXPR",
        help="limit a role (publish, subscribe) to an expression of the schema, e.g. 'subscribe=sym prefix \"AB\"'",
    )
    c.add_argument(
        "--ttl",
        type=duration,
        default=duration(DEFAULT_TTL),
        help=f"lifetime: seconds, or 90s/15m/8h/30d (default {DEFAULT_TTL})",
    )
    c.add_argument(
        "--limit",
        action="append",
        type=_limit,
        default=[],
        metavar="KEY=NUMBER",
        help=f"override a [limits] setting for this client ({', '.join(CLIENT_KEYS)}); repeat for several",
    )
    c.add_argument(
        "--subject", type=_subject, default=None, help="the client id the token is for (default: a new random one)"
    )
    c.add_argument("--key", default=None, help="the signing key (default: the config's [auth] signing_key)")
    c.set_defaults(func=cmd_create)
    v = actions.add_parser(
        "verify", help="what a token allows on this cluster, or why it is refused", description="check a token"
    )
    v.add_argument("--config", required=True)
    v.add_argument("token", nargs="?", default=None, help=f"the token (default: ${TOKEN_ENV})")
    v.set_defaults(func=cmd_verify)
    k = actions.add_parser("keys", help="make an Ed25519 key pair for development", description="make a key pair")
    k.add_argument("dir", type=Path, help="directory for auth.key and auth.pub")
    k.add_argument("--force", action="store_true", help="replace an existing pair (voids its tokens)")
    k.set_defaults(func=cmd_keys)
