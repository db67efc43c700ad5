"""A conversation's files (attached by people, written by scripts under /output), kept with its runs.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

from rockbot.console.store_schema import UtcDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversation_files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("agent", sa.String(63), nullable=False),
        sa.Column("caller", sa.String(256), nullable=False),
        sa.Column("session_id", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False, server_default=""),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("media_type", sa.String(128), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
    )
    op.create_index("conversation_files_by_conversation", "conversation_files",
                    ["namespace", "agent", "caller", "session_id", "created_at"])  # fmt: skip
    op.create_index("conversation_files_by_run", "conversation_files", ["run_id"])
    op.create_index("conversation_files_by_expiry", "conversation_files", ["expires_at"])


def downgrade() -> None:
    op.drop_table("conversation_files")
