"""Long-term memory: what agents were told to remember, with its embedding, and each scope's usage.

On PostgreSQL the pgvector extension is created here (the chart's database image has it; an existing
server needs pgvector installed, and a superuser to run `CREATE EXTENSION vector` in the database once when the
console's user is not one), and an HNSW index (cosine) is made per common embedding size, partial on that size.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

from rockbot.console.store_schema import Embedding, UtcDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

#: The sizes `store_schema.INDEXED_DIMENSIONS` names, as they were when this revision was written.
_INDEXED = (384, 512, 768, 1024, 1536)


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table(
        "memories",
        sa.Column("id", sa.String(18), primary_key=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("agent", sa.String(63), nullable=False),
        sa.Column("scope", sa.String(256), nullable=False),
        sa.Column("caller", sa.String(256), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("dims", sa.SmallInteger(), nullable=False),
        sa.Column("embedding", Embedding(), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False, server_default=""),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
    )
    op.create_index("memories_by_scope", "memories", ["namespace", "agent", "scope", "created_at"])
    op.create_index("memories_by_caller", "memories", ["caller", "created_at"])
    op.create_index("memories_by_expiry", "memories", ["expires_at"])
    op.create_table(
        "memory_usage",
        sa.Column("namespace", sa.String(63), primary_key=True),
        sa.Column("agent", sa.String(63), primary_key=True),
        sa.Column("scope", sa.String(256), primary_key=True),
        sa.Column("items_held", sa.Integer(), nullable=False),
        sa.Column("bytes_held", sa.BigInteger(), nullable=False),
    )
    if postgres:
        for dims in _INDEXED:
            op.execute(f"CREATE INDEX memories_hnsw_{dims} ON memories USING hnsw "
                       f"((embedding::vector({dims})) vector_cosine_ops) WHERE dims = {dims}")  # fmt: skip


def downgrade() -> None:
    op.drop_table("memory_usage")
    op.drop_table("memories")
