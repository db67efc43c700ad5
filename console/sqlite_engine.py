"""SQLite as the run store opens it: WAL, a busy wait, and sqlite-vec (vector search for long-term memory) loaded
into every connection.

sqlite-vec is a loadable extension, and some Pythons' `sqlite3` cannot load one (built without
`--enable-loadable-sqlite-extensions`: pyenv's default build, macOS's system Python). There the store
connects through `sqlean.py` instead, the same DB-API with SQLite built to load extensions, and its
exceptions stand in for `sqlite3`'s so that SQLAlchemy still reports a locked or broken database as
one (`OperationalError`).
"""

from __future__ import annotations

import sqlite3
import types
from typing import Any

import aiosqlite
import sqlite_vec
from sqlalchemy import event
from sqlalchemy.dialects.sqlite.aiosqlite import AsyncAdapt_aiosqlite_dbapi
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

#: Whether this interpreter's `sqlite3` can load extensions (else `sqlean` connects).
LOADS_EXTENSIONS = hasattr(sqlite3.Connection, "enable_load_extension")
#: How much of the database file is read through a memory map (address space, not memory: the kernel's page cache
#: holds the pages either way).
MMAP_BYTES = 1 << 30
_EXCEPTIONS = ("DatabaseError", "Error", "IntegrityError", "NotSupportedError", "OperationalError",
               "ProgrammingError", "sqlite_version", "sqlite_version_info")  # fmt: skip


def create_engine(url: str) -> AsyncEngine:
    """An engine on the SQLite file of `url` (`sqlite+aiosqlite:///PATH`) whose connections have sqlite-vec."""
    if LOADS_EXTENSIONS:
        engine = create_async_engine(url)
    else:
        import sqlean

        path = make_url(url).database or ":memory:"
        driver = types.SimpleNamespace(
            **{name: getattr(sqlean, name) for name in _EXCEPTIONS},
            Connection=aiosqlite.Connection, connect=aiosqlite.connect, __version__=aiosqlite.__version__,
        )  # fmt: skip
        def connection() -> aiosqlite.Connection:
            made = aiosqlite.Connection(lambda: sqlean.connect(path), 64)
            made._thread.daemon = True  # as SQLAlchemy makes its own: a store left open never holds the process
            return made

        engine = create_async_engine(url, module=AsyncAdapt_aiosqlite_dbapi(driver, sqlean),  # type: ignore[arg-type]
                                     async_creator=connection)  # fmt: skip
    event.listen(engine.sync_engine, "connect", _prepare)
    return engine


def _prepare(dbapi_connection: Any, _record: Any) -> None:
    """WAL: `rockbot runs` reads while `rockbot local` writes; a busy wait instead of 'database is locked'; the file
    read through a memory map (a recall reads a scope's every embedding: through the map it costs half the CPU of
    SQLite's reads into its own page cache, and no system call per page); and sqlite-vec's functions
    (`vec_distance_cosine`)."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout=5000")  # first: switching to WAL waits for a writer too
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA mmap_size={MMAP_BYTES}")
    cursor.close()
    dbapi_connection.run_async(_load_vec)


async def _load_vec(connection: aiosqlite.Connection) -> None:
    await connection.enable_load_extension(True)
    try:
        await connection.load_extension(sqlite_vec.loadable_path())
    finally:
        await connection.enable_load_extension(False)
