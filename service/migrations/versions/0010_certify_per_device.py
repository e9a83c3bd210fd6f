"""Certify jobs per device class: besides the job queued when a kernel is published, a kernel gets one job for
each other device class (another GPU driver or CUDA) whose certifier asks for work, so that every class a client
runs on can be certified by the service. `wanted` names that class ('' for the publish-time job).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


# SQLite rebuilds the table: keep AUTOINCREMENT, so job ids are never reused (a client follows a job by its id)
_REBUILD = {"sqlite_autoincrement": True}


def upgrade() -> None:
    with op.batch_alter_table("certify_jobs", table_kwargs=_REBUILD) as batch:
        batch.add_column(sa.Column("wanted", sa.String(160), nullable=False, server_default=""))
        batch.drop_constraint("uq_certify_jobs_key", type_="unique")
        batch.create_unique_constraint("uq_certify_jobs_key_wanted", ["kernel_key", "wanted"])


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM certify_jobs WHERE wanted != ''"))
    with op.batch_alter_table("certify_jobs", table_kwargs=_REBUILD) as batch:
        batch.drop_constraint("uq_certify_jobs_key_wanted", type_="unique")
        batch.create_unique_constraint("uq_certify_jobs_key", ["kernel_key"])
        batch.drop_column("wanted")
