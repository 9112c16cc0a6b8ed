"""Log lines that a client can trigger at will, without letting it flood the log.

A misbehaving client can repeat a bad frame thousands of times a second, and a bug that one
kind of input triggers can fire for every session and every frame; one log line (let alone a
traceback) each would drown everything else and cost the process time. :class:`RateLimitedLog`
writes a given *cause* at most once per interval and counts what it holds back; the next line
written for that cause says how many were suppressed, so nothing goes unaccounted for.

Example::

    _bad_text = RateLimitedLog(logging.getLogger(__name__), interval_s=10.0)
    _bad_text.warning("invalid_utf8", "client %s sent a text frame that is not UTF-8", peer)
    _failures.exception(cause_of(exc), f"session {sid} failed", exc)  # with its traceback

Causes are chosen by the code (a fixed string per kind of event, or :func:`cause_of` an
exception: its type and the line that raised it), never client data: the log keeps one small
record per cause (at most 256, the oldest forgotten first). Shared by the gateway and the
worker (it lives in the lower layer). Meant for one event loop or thread (no locking).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, replace

__all__ = ["RateLimitedLog", "cause_of"]

# Appended to the first line written after some were held back.
_SUPPRESSED = " (%d similar lines suppressed since the last one)"

# Causes remembered at most: a safety net should client data ever be passed as a cause; the
# oldest is forgotten first (it is then written again at its next occurrence).
_MAX_CAUSES = 256


@dataclass(frozen=True, slots=True)
class _CauseState:
    """When a cause may next be written, and how many lines were held back since the last."""

    next_allowed: float
    suppressed: int = 0


class RateLimitedLog:
    """Writes each cause at most once per ``interval_s`` to ``logger``.

    Args:
        logger: where lines go.
        interval_s: the shortest time between two lines of one cause.
        clock: monotonic seconds; injectable so tests can step time.
    """

    def __init__(self, logger: logging.Logger, *, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._causes: dict[Hashable, _CauseState] = {}

    def log(self, level: int, cause: Hashable, message: str, *args: object,
            exc_info: BaseException | None = None,
            extra: Mapping[str, object] | None = None) -> bool:
        """Write ``message % args`` at ``level`` (with ``exc_info``'s traceback, if given)
        unless ``cause`` was written less than ``interval_s`` ago; then count it as
        suppressed instead. ``extra`` goes onto the record (``session_id``, ``worker_id``:
        the structured log's keys).

        Returns:
            Whether the line was written.
        """
        now = self._clock()
        state = self._causes.get(cause)
        if state is not None and now < state.next_allowed:
            self._causes[cause] = replace(state, suppressed=state.suppressed + 1)
            return False
        suppressed = state.suppressed if state is not None else 0
        self._causes.pop(cause, None)  # re-inserted last: the dict's order is by last write
        if len(self._causes) >= _MAX_CAUSES:
            del self._causes[next(iter(self._causes))]
        self._causes[cause] = _CauseState(next_allowed=now + self._interval_s)
        if suppressed:
            self._logger.log(level, message + _SUPPRESSED, *args, suppressed, exc_info=exc_info,
                             extra=extra)
        else:
            self._logger.log(level, message, *args, exc_info=exc_info, extra=extra)
        return True

    def warning(self, cause: Hashable, message: str, *args: object,
                extra: Mapping[str, object] | None = None) -> bool:
        """:meth:`log` at ``WARNING``."""
        return self.log(logging.WARNING, cause, message, *args, extra=extra)

    def exception(self, cause: Hashable, message: str, exc: BaseException,
                  extra: Mapping[str, object] | None = None) -> bool:
        """:meth:`log` ``message`` at ``ERROR`` with ``exc``'s traceback."""
        return self.log(logging.ERROR, cause, "%s", message, exc_info=exc, extra=extra)

    def suppressed(self, cause: Hashable) -> int:
        """How many lines of ``cause`` were held back since the last one written."""
        state = self._causes.get(cause)
        return 0 if state is None else state.suppressed


def cause_of(exc: BaseException) -> tuple[str, str, int]:
    """The exception's type and the innermost place it was raised: one bug, one cause."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return type(exc).__qualname__, "", 0
    return type(exc).__qualname__, tb.tb_frame.f_code.co_filename, tb.tb_lineno
