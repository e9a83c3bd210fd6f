"""On-demand certification: a published kernel becomes a certify job that a certifier (fa4_aot/certify/certifier.py)
claims on a GPU of its SKU, runs and finishes with its verdicts.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "certify_jobs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("kernel_key", sa.String(64), nullable=False),
        sa.Column("sku", sa.String(64), nullable=False),
        sa.Column("family", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lapses", sa.Integer(), nullable=False),
        sa.Column("certifier", sa.String(128), nullable=False),
        sa.Column("device", sa.String(160), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column("claim_hash", sa.String(64), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished", sa.DateTime(timezone=True), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("verdicts", sa.Text(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.UniqueConstraint("kernel_key", name="uq_certify_jobs_key"),
        sqlite_autoincrement=True,  # ids are never reused: a client following job N never follows another
    )
    op.create_index("ix_certify_jobs_sku", "certify_jobs", ["sku"])
    op.create_index("ix_certify_jobs_status", "certify_jobs", ["status"])


def downgrade() -> None:
    op.drop_index("ix_certify_jobs_status", table_name="certify_jobs")
    op.drop_index("ix_certify_jobs_sku", table_name="certify_jobs")
    op.drop_table("certify_jobs")
