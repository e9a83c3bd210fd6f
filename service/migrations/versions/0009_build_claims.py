"""Build jobs are held by a claim: the claiming token and the hash of the claim id its
claim was answered with (only they renew or finish the job), and the time before which a job queued again after a
transient failure is not claimed (its retry's backoff).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("build_jobs") as batch:
        batch.add_column(sa.Column("token_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("claim_hash", sa.String(64), nullable=False, server_default=""))
        batch.add_column(sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("build_jobs") as batch:
        batch.drop_column("not_before")
        batch.drop_column("claim_hash")
        batch.drop_column("token_id")
