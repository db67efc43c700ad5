"""Long-term memories kept before their embedding: `remember` answers once the text is kept within its bounds, and
the agent embeds it after (a pending memory has no embedding and `dims` 0, so no recall or HNSW index sees it).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

from rockbot.console.store_schema import Embedding

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("memories") as table:
        table.alter_column("embedding", existing_type=Embedding(), nullable=True)
    op.create_index("memories_pending", "memories", ["namespace", "agent", "created_at"],
                    postgresql_where=sa.text("dims = 0"), sqlite_where=sa.text("dims = 0"))  # fmt: skip


def downgrade() -> None:
    op.drop_index("memories_pending", table_name="memories")
    op.execute("DELETE FROM memories WHERE embedding IS NULL")
    with op.batch_alter_table("memories") as table:
        table.alter_column("embedding", existing_type=Embedding(), nullable=False)
