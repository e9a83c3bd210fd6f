"""Initial schema: objects, skus, kernels, tokens, misses.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "objects",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "skus",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("arch", sa.String(32), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.Column("l2_bytes", sa.BigInteger(), nullable=False),
        sa.Column("cuda_major", sa.Integer(), nullable=False),
    )
    op.create_table(
        "kernels",
        sa.Column("kernel_key", sa.String(64), primary_key=True),
        sa.Column("object_digest", sa.String(64), sa.ForeignKey("objects.digest"), nullable=False),
        sa.Column("sku", sa.String(64), sa.ForeignKey("skus.name"), nullable=False),
        sa.Column("family", sa.String(128), nullable=False),
        sa.Column("compile_key", sa.Text(), nullable=False),
        sa.Column("toolchain", sa.Text(), nullable=False),
        sa.Column("variant", sa.Text(), nullable=False),
        sa.Column("call", sa.Text(), nullable=False),
        sa.Column("compile_seconds", sa.Float(), nullable=False),
        sa.Column("hardware_queries", sa.Text(), nullable=False),
        sa.Column("created", sa.String(40), nullable=False),
    )
    op.create_index("ix_kernels_object_digest", "kernels", ["object_digest"])
    op.create_index("ix_kernels_sku", "kernels", ["sku"])
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked", sa.Boolean(), nullable=False),
    )
    op.create_table(
        "misses",
        sa.Column("kernel_key", sa.String(64), primary_key=True),
        sa.Column("sku", sa.String(64), nullable=False),
        sa.Column("family", sa.String(128), nullable=False),
        sa.Column("compile_key", sa.Text(), nullable=False),
        sa.Column("call", sa.Text(), nullable=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_misses_sku", "misses", ["sku"])


def downgrade() -> None:
    op.drop_index("ix_misses_sku", "misses")
    op.drop_table("misses")
    op.drop_table("tokens")
    op.drop_index("ix_kernels_sku", "kernels")
    op.drop_index("ix_kernels_object_digest", "kernels")
    op.drop_table("kernels")
    op.drop_table("skus")
    op.drop_table("objects")
