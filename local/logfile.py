"""`rockbot local` keeps its log in a file, so log lines never land in the middle of the chat (`-v` shows them).

The file is `$XDG_STATE_HOME/rockbot/local.log` (`~/.local/state/rockbot/local.log` by default), appended to
by each run; the banner says when a run logged warnings there.
"""

from __future__ import annotations

import logging
import os
import pathlib


class LogFile(logging.FileHandler):
    """A log file that counts the warnings written to it."""

    def __init__(self, path: pathlib.Path) -> None:
        super().__init__(path, encoding="utf-8")
        self.path = path
        self.warnings = 0
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.warnings += 1
        super().emit(record)


def default_path() -> pathlib.Path:
    state = os.environ.get("XDG_STATE_HOME") or pathlib.Path.home() / ".local" / "state"
    return pathlib.Path(state) / "rockbot" / "local.log"


def log_to_file(path: pathlib.Path) -> LogFile | None:
    """Send every log record (INFO and up) to `path`; None, leaving logging alone, if it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = LogFile(path)
    except OSError:
        return None
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    return handler
