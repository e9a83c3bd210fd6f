"""Trust: signed manifests, revocations, an audit log, and tokens limited to a set of SKUs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "signed_manifests",
        sa.Column("manifest_id", sa.String(64), primary_key=True),
        sa.Column("sku", sa.String(64), sa.ForeignKey("skus.name"), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("created", sa.String(40), nullable=False),
        sa.Column("expires", sa.String(40), nullable=False),
        sa.Column("envelope", sa.Text(), nullable=False),
        sa.Column("uploaded_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_signed_manifests_sku", "signed_manifests", ["sku"])
    op.create_table(
        "revocations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("ident", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("kind", "ident", name="uq_revocations_kind_ident"),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.String(255), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
    )
    # Nullable, so existing tokens keep publishing to every SKU; SQLite adds a nullable column in place.
    op.add_column("tokens", sa.Column("skus", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tokens") as batch:  # SQLite drops a column by copying the table
        batch.drop_column("skus")
    op.drop_table("audit_log")
    op.drop_table("revocations")
    op.drop_index("ix_signed_manifests_sku", "signed_manifests")
    op.drop_table("signed_manifests")
