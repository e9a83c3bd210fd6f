"""Database operations on tokens, keyword-only, as crud.py's: a token's plaintext is shown once (at create and
rotate) and the database keeps its sha256; each change commits with its audit entry."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fa4_aot.domain.kernel_keys import dumps as canonical_json

from .. import db, models, schemas
from ..crud import record_audit
from ..errors import InvalidInput, TokenNotFound
from ..models import utcnow

SCOPES = ("read", "publish", "admin")
TOKEN_PREFIX = "fa4_"


def hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def token_label(token: models.Token) -> str:
    """How the audit log names a token: its name, or #<id> for an unnamed one (the CLI's default name)."""
    return token.name or f"#{token.id}"


def token_skus(token: models.Token) -> list[str] | None:
    """The SKUs a token may publish to, or None for every SKU."""
    return None if token.skus is None else list(json.loads(token.skus))


def create_token(session: Session, *, name: str, scope: str, skus: list[str] | None = None) -> str:
    """Create a token and return its plaintext, which is shown only here: the database keeps its sha256.

    `scope` is read (GET/HEAD, misses), publish (also PUT objects, POST kernels, PUT manifests) or admin
    (everything, including revocations and the audit log); `name` is a label (may be empty, at most 128
    characters) that revoke_token and rotate_token select by, unique among active tokens unless empty.
    `skus` limits a publish token to kernels and manifests of those SKUs (None: every SKU). Raises InvalidInput.
    """
    _check_token_args(name, scope, skus)
    db.lock_table(session, models.Token)  # two creators of one name: the second sees the first's token
    if name and _active_tokens(session, name):
        raise InvalidInput(f"an active token is already named {name!r}: rotate it with `fa4-aot token rotate "
                           f"--name {name}`, revoke it with `fa4-aot token revoke --name {name}`, or pick another name")
    stored = None if skus is None else canonical_json(sorted(set(skus)))
    plaintext, token = _add_token(session, name=name, scope=scope, skus=stored)
    record_audit(session, actor="cli", action="token.create", target=token_label(token),
                 detail={"token_id": token.id, "scope": scope, "skus": token_skus(token)})
    session.commit()
    return plaintext


def rotate_token(session: Session, *, name: str) -> str:
    """Issue a new plaintext for the active token called `name` (same name, scope and SKUs) and revoke the old
    one, in one transaction; returns the new plaintext. Raises TokenNotFound if no active token has that
    name, InvalidInput if several do (tokens created before names were unique)."""
    db.lock_table(session, models.Token)
    tokens = _active_tokens(session, name)
    if not tokens:
        raise TokenNotFound(f"no active token named {name!r}; list tokens with `fa4-aot token list`")
    if len(tokens) > 1:
        raise InvalidInput(f"{len(tokens)} active tokens are named {name!r}, so rotating is ambiguous: revoke them "
                           f"with `fa4-aot token revoke --name {name}` and create one")
    old = tokens[0]
    old.revoked = True
    plaintext, new = _add_token(session, name=old.name, scope=old.scope, skus=old.skus)
    record_audit(session, actor="cli", action="token.rotate", target=token_label(new),
                 detail={"token_id": new.id, "revoked_token_id": old.id, "scope": new.scope,
                         "skus": token_skus(new)})
    session.commit()
    return plaintext


def revoke_token(session: Session, *, name: str) -> int:
    """Revoke every active token called `name`; returns how many. Raises TokenNotFound if none is active."""
    tokens = _active_tokens(session, name)
    if not tokens:
        raise TokenNotFound(f"no active token named {name!r}; list tokens with `fa4-aot token list`")
    for token in tokens:
        token.revoked = True
        record_audit(session, actor="cli", action="token.revoke", target=token_label(token),
                     detail={"token_id": token.id, "scope": token.scope})
    session.commit()
    return len(tokens)


def list_tokens(session: Session) -> list[dict[str, Any]]:
    """Every token (never its plaintext or hash), oldest first: id, name, scope, skus, created, revoked."""
    rows = session.scalars(select(models.Token).order_by(models.Token.id)).all()
    return [{"id": t.id, "name": token_label(t), "scope": t.scope, "skus": token_skus(t),
             "created": t.created.isoformat(), "revoked": t.revoked} for t in rows]


def find_token(session: Session, *, plaintext: str) -> models.Token | None:
    """The token whose sha256 matches `plaintext` (revoked or not), or None."""
    return session.scalar(select(models.Token).where(models.Token.token_hash == hash_token(plaintext)))


def _active_tokens(session: Session, name: str) -> list[models.Token]:
    query = select(models.Token).where(models.Token.name == name, ~models.Token.revoked).order_by(models.Token.id)
    return list(session.scalars(query).all())


def _add_token(session: Session, *, name: str, scope: str, skus: str | None) -> tuple[str, models.Token]:
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = models.Token(name=name, token_hash=hash_token(plaintext), scope=scope, created=utcnow(), skus=skus)
    session.add(token)
    session.flush()  # assigns the id the audit entry names
    return plaintext, token


def _check_token_args(name: str, scope: str, skus: list[str] | None) -> None:
    if scope not in SCOPES:
        raise InvalidInput(f"invalid token scope {scope!r}: expected one of {', '.join(SCOPES)}")
    if len(name) > 128:
        raise InvalidInput(f"invalid token name {name[:20]!r}...: expected at most 128 characters")
    if skus is None:
        return
    if scope != "publish":
        raise InvalidInput(f"a SKU list limits what a token publishes, so it needs scope publish, not {scope!r}")
    if not skus:
        raise InvalidInput("empty SKU list: give at least one SKU, or none at all for a token valid for every SKU")
    for sku in skus:
        if not isinstance(sku, str) or len(sku) > 64 or not re.fullmatch(schemas.SKU_NAME, sku):
            raise InvalidInput(f"invalid SKU name {sku!r}: expected [a-z0-9][a-z0-9-]*, at most 64 characters")
