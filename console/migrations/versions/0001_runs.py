"""Runs and their timelines.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from rockbot.console.store_schema import BigKey, UtcDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("agent", sa.String(63), nullable=False),
        sa.Column("source", sa.String(32), nullable=False, server_default=""),
        sa.Column("caller", sa.String(256), nullable=False, server_default=""),
        sa.Column("session_id", sa.String(256), nullable=False, server_default=""),
        sa.Column("parent_run_id", sa.String(64), nullable=True),
        sa.Column("request_id", sa.String(256), nullable=False, server_default=""),
        sa.Column("trace_id", sa.String(32), nullable=False, server_default=""),
        sa.Column("model", sa.String(256), nullable=False, server_default=""),
        sa.Column("record", sa.String(16), nullable=False, server_default="Full"),
        sa.Column("started_at", UtcDateTime(), nullable=False),
        sa.Column("ended_at", UtcDateTime(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("error", sa.Text(), nullable=False, server_default=""),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("tool_calls", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
    )
    op.create_index("runs_by_time", "runs", ["started_at", "run_id"])
    op.create_index("runs_by_agent", "runs", ["namespace", "agent", "started_at", "run_id"])
    op.create_index("runs_by_source", "runs", ["source", "started_at", "run_id"])
    op.create_index("runs_by_outcome", "runs", ["outcome", "started_at", "run_id"])
    op.create_index("runs_by_session", "runs", ["namespace", "agent", "session_id", "caller", "started_at"])
    op.create_index("runs_by_parent", "runs", ["parent_run_id"])
    op.create_index("runs_by_expiry", "runs", ["expires_at"])
    op.create_table(
        "run_events",
        sa.Column("id", BigKey, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("name", sa.String(256), nullable=False, server_default=""),
        sa.Column("status", sa.String(256), nullable=False, server_default=""),
        sa.Column("duration_seconds", sa.Float(), nullable=True),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.UniqueConstraint("run_id", "event_id", name="run_events_once"),
    )
    op.create_index("run_events_timeline", "run_events", ["run_id", "at", "id"])


def downgrade() -> None:
    op.drop_table("run_events")
    op.drop_table("runs")
