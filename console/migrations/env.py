"""Alembic's environment: migrate over the connection `Store.migrate` holds (and has locked)."""

from alembic import context

from rockbot.console.store_schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection, target_metadata=metadata, render_as_batch=connection.dialect.name == "sqlite"
)
with context.begin_transaction():
    context.run_migrations()
