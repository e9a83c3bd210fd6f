"""Certified kernels: what `fa4-aot certify` measured of a kernel on a device class.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "verdicts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("kernel_key", sa.String(64), sa.ForeignKey("kernels.kernel_key"), nullable=False),
        sa.Column("device", sa.String(160), nullable=False),
        sa.Column("sku", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("tensor", sa.String(16), nullable=False),
        sa.Column("error", sa.Float(), nullable=True),
        sa.Column("bound", sa.Float(), nullable=True),
        sa.Column("checks", sa.Integer(), nullable=False),
        sa.Column("calls", sa.Text(), nullable=False),
        sa.Column("toolchain", sa.String(256), nullable=False),
        sa.Column("measured", sa.String(40), nullable=False),
        sa.Column("publisher", sa.String(128), nullable=False),
        sa.Column("recorded", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("kernel_key", "device", name="uq_verdicts_kernel_device"),
    )
    op.create_index("ix_verdicts_sku", "verdicts", ["sku"])
    op.create_index("ix_verdicts_status", "verdicts", ["status"])


def downgrade() -> None:
    op.drop_index("ix_verdicts_status", table_name="verdicts")
    op.drop_index("ix_verdicts_sku", table_name="verdicts")
    op.drop_table("verdicts")
