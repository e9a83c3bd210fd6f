"""Misses carry the exact FA4 arguments of the call that needed the kernel (fa4_aot.domain.exact), which
`fa4-aot build --from-misses` replays; NULL for misses reported by older clients.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("misses") as batch:
        batch.add_column(sa.Column("args", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("misses") as batch:
        batch.drop_column("args")
