"""Working memory: the chunks of large tool results, kept per conversation through the run that stored them.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

from rockbot.console.store_schema import UtcDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "working_memory",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True),
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("content_cut", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("stored_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
    )
    op.create_index("working_memory_by_key", "working_memory", ["key"])
    op.create_index("working_memory_by_expiry", "working_memory", ["expires_at"])


def downgrade() -> None:
    op.drop_table("working_memory")
