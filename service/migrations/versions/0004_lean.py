"""Lean runtime: kernels keep their linked libraries (shared_libs), and recipe files get a table.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, so existing kernels read as having no library; SQLite adds a nullable column in place.
    op.add_column("kernels", sa.Column("shared_libs", sa.Text(), nullable=True))
    op.create_table(
        "recipes",
        sa.Column("recipe_key", sa.String(64), primary_key=True),
        sa.Column("target", sa.String(255), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("updated", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_recipes_target", "recipes", ["target"])


def downgrade() -> None:
    op.drop_index("ix_recipes_target", "recipes")
    op.drop_table("recipes")
    with op.batch_alter_table("kernels") as batch:  # SQLite drops a column by copying the table
        batch.drop_column("shared_libs")
