"""The chunks of a script's file while the scripts-manager writes it (a file is visible only once whole).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

from rockbot.console.store_schema import UtcDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "file_parts",
        sa.Column("file_id", sa.String(40), primary_key=True),
        sa.Column("start_byte", sa.BigInteger(), primary_key=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("agent", sa.String(63), nullable=False),
        sa.Column("caller", sa.String(256), nullable=False),
        sa.Column("session_id", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
    )
    op.create_index("file_parts_by_age", "file_parts", ["created_at"])


def downgrade() -> None:
    op.drop_table("file_parts")
