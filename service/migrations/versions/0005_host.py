"""Host targets: a SKU's facts include the host target its kernels' host code is built for (fa4_aot/domain/hosts.py).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # SKUs published before host targets existed keep "": their kernels' keys name no host target
    op.add_column("skus", sa.Column("host", sa.String(32), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("skus") as batch:  # SQLite drops a column by copying the table
        batch.drop_column("host")
