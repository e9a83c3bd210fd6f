"""Lean-runtime recipe files in the database, keyword-only like crud.py (writes commit themselves and are
audited; reads never raise for a missing row). The bytes live in the store's recipes/ (Store.put_recipes).

Newest wins: a recipe file grows as builds record more regions of its signature, so a publish replaces the
held file (audited with both digests) rather than being refused. Clients with trusted keys load only a file
whose sha256 a valid signed manifest lists, so a replaced file needs a new `fa4-aot sign` before they use it.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from fa4_aot.domain.kernel_keys import dumps as canonical_json

from .. import models, schemas
from ..crud import record_audit, retrying
from ..errors import Conflict, NotFound
from ..models import utcnow


def target_of(session: Session, *, sku: str, read: bool = False) -> str:
    """Canonical JSON of the SKU's target facts (what recipe keys hash); for an unknown SKU, NotFound when
    `read`, else Conflict."""
    row = session.get(models.Sku, sku)
    if row is None:
        error = NotFound if read else Conflict
        raise error(f"unknown SKU {sku!r}: publish its kernels first (`fa4-aot push --sku {sku}` does, kernels "
                    "before recipes)")
    facts = schemas.SkuFacts.model_validate(row).model_dump()
    del facts["name"]
    return canonical_json(facts)


def record_recipe(session: Session, *, key: str, target: str, digest: str, size: int, actor: str) -> bool:
    """Record that the store now holds recipe file `key` with `digest`; returns True unless it already held
    exactly that. A different digest replaces the row (newest wins)."""

    def work() -> bool:
        row = session.get(models.Recipe, key)
        if row is not None and row.digest == digest and row.target == target:
            return False
        action = "recipe.create" if row is None else "recipe.replace"
        detail = {"digest": digest, "size": size, **({} if row is None else {"replaced": row.digest})}
        if row is None:
            row = models.Recipe(recipe_key=key)
            session.add(row)
        row.target, row.digest, row.size, row.updated = target, digest, size, utcnow()
        record_audit(session, actor=actor, action=action, target=key, detail=detail)
        session.flush()
        return True

    return retrying(session, work)


def list_recipes(session: Session, *, target: str) -> list[schemas.RecipeOut]:
    rows = session.scalars(select(models.Recipe).where(models.Recipe.target == target)
                           .order_by(models.Recipe.recipe_key)).all()
    return [schemas.RecipeOut(key=r.recipe_key, digest=r.digest, size=r.size) for r in rows]


def get_recipe(session: Session, *, key: str, target: str) -> models.Recipe | None:
    row = session.get(models.Recipe, key)
    return row if row is not None and row.target == target else None
