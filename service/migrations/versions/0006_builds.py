"""On-demand builds: a reported miss becomes a build job that a builder (fa4_aot/compile/builder.py) claims, runs and
publishes.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "build_jobs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("sku", sa.String(64), nullable=False),
        sa.Column("kernel_key", sa.String(64), nullable=False),
        sa.Column("family", sa.String(128), nullable=False),
        sa.Column("compile_key", sa.Text(), nullable=False),
        sa.Column("call", sa.Text(), nullable=True),
        sa.Column("args", sa.Text(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("requester", sa.String(160), nullable=False),
        sa.Column("reports", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("builder", sa.String(128), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished", sa.DateTime(timezone=True), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("compile_seconds", sa.Float(), nullable=False),
        sa.Column("built", sa.Integer(), nullable=False),
        sa.UniqueConstraint("sku", "kernel_key", name="uq_build_jobs_sku_key"),
        sqlite_autoincrement=True,  # ids are never reused: a client following job N never follows another
    )
    op.create_index("ix_build_jobs_status", "build_jobs", ["status"])
    op.create_index("ix_build_jobs_requester", "build_jobs", ["requester"])


def downgrade() -> None:
    op.drop_index("ix_build_jobs_requester", table_name="build_jobs")
    op.drop_index("ix_build_jobs_status", table_name="build_jobs")
    op.drop_table("build_jobs")
