"""How every ``duplex-gateway`` process logs: its level and format, a setting like the others.

``text`` (the default) is the classic one line per record for a person at a terminal; ``json``
is one JSON object per line for a log pipeline: ``ts`` (ISO 8601, UTC, milliseconds), ``level``,
``logger``, ``message``, plus ``session_id`` and ``worker_id`` when the record carries them and
``exc`` (the traceback) when it has one. A line that concerns one session carries its id the
same way everywhere: ``_log.info("...", extra={"session_id": session_id})``.

Secrets are kept out of the log by the code that logs (it never formats a key or a token) and,
in the gateway, by :class:`gateway.logredact.DropQueryStrings` on every handler; the format does
not change what a line says, only how it is written.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from runtime.config import Choices, check_fields

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "JsonFormatter", "LogSettings", "TextFormatter",
           "configure_logging", "formatter_class", "log_stray_failures"]

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
# The record attributes a line may carry that identify what it is about (``extra=``).
_ID_FIELDS = ("session_id", "worker_id")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True, slots=True, kw_only=True)
class LogSettings:
    """How one process logs (every subcommand: serve, worker, dev, bench)."""

    log_level: str = field(
        default="info",
        metadata={"help": "lowest level logged: debug, info, warning, error",
                  "accepts": Choices(LOG_LEVELS)},
    )
    log_format: str = field(
        default="text",
        metadata={"help": "text (one line for a person) or json (one JSON object per line:"
                          " ts, level, logger, message, session_id, worker_id, exc)",
                  "accepts": Choices(LOG_FORMATS)},
    )

    def __post_init__(self) -> None:
        """Refuse a level or format that is not one of the choices."""
        check_fields(self)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside values are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _utc_timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _ID_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # Whatever a caller put in ``extra`` (an exception, a path) is written as its str().
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """The classic text line; a record about a session whose message does not name it gets
    `` session=<id>`` appended, so every per-session line can be found by its id."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        session_id = record.__dict__.get("session_id")
        if session_id is not None and str(session_id) not in record.message:
            text += f" session={session_id}"
        return text


def _utc_timestamp(created: float) -> str:
    """``2026-01-01T12:00:00.123Z``."""
    moment = datetime.fromtimestamp(created, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def formatter_class(settings: LogSettings) -> type[logging.Formatter]:
    """The formatter of ``settings.log_format``."""
    return JsonFormatter if settings.log_format == "json" else TextFormatter


def configure_logging(settings: LogSettings) -> None:
    """Send the process's records to stderr at ``settings.log_level`` in its format, the
    failures Python would print past the log too (:func:`log_stray_failures`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter_class(settings)())
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler])
    if handler in logging.getLogger().handlers:  # not when the logging is someone else's
        log_stray_failures()  # (a test runner calling main(): its hooks stay its own)
    if settings.log_format == "json":
        # A Python warning is printed to stderr as text by default: a line a JSON log
        # pipeline could not parse. As a record it is one JSON line like the rest.
        logging.captureWarnings(True)


_stray = logging.getLogger("duplex_gateway.stray")


def log_stray_failures() -> None:
    """Log, at ERROR, what Python would print to stderr past the log: an exception it could
    not raise (in a ``__del__``, a collector callback, a finaliser: "Exception ignored in")
    and one that ended a thread. Printed, such a traceback has no level, no time and no
    session; in a JSON log it is a run of lines no pipeline can parse."""
    sys.unraisablehook = _log_unraisable
    threading.excepthook = _log_thread_failure


def _log_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    where = unraisable.err_msg or "Exception ignored in"
    failure = unraisable.exc_value
    _stray.error("%s: %r", where, unraisable.object,
                 exc_info=(unraisable.exc_type, failure, unraisable.exc_traceback)
                 if failure is not None else None)


def _log_thread_failure(failed: threading.ExceptHookArgs) -> None:
    if failed.exc_type is SystemExit:
        return  # how a thread ends on purpose; Python prints nothing for it either
    name = failed.thread.name if failed.thread is not None else "a thread"
    _stray.error("%s ended on an exception", name,
                 exc_info=(failed.exc_type, failed.exc_value, failed.exc_traceback)
                 if failed.exc_value is not None else None)
