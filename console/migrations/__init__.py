"""Alembic migrations of the run store (`Store.migrate` runs them; no alembic.ini: the store passes its connection)."""
