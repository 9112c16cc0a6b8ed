"""The terminal of ``duplex-gateway talk``: transcripts on stdout; notices and a progress bar
on stderr."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Final, TextIO

from duplex_gateway.talk_answer import Said

__all__ = ["Console"]

#: Progress redraws at most this often (every event would be 50 redraws a second).
_REDRAW_S: Final = 0.1
_BAR_WIDTH: Final = 24


class Console:
    """Transcripts on stdout; notices and the progress bar on stderr.

    The bar is drawn only on a terminal, and only while no transcript line is half written
    (both may be the same screen); elsewhere the notices are the progress, one plain line
    each.
    """

    def __init__(self, out: TextIO, err: TextIO, *, bar: bool) -> None:
        self._out = out
        self._err = err
        self._bar = bar
        self._line_open = False
        self._speaker = ""
        self._bar_shown = False
        self._last_draw = 0.0
        self._status = ""

    def said(self, said: Said) -> None:
        """Print transcript text: a line per speaker, streamed as its pieces come."""
        self._clear_bar()
        if self._line_open and said.speaker != self._speaker:
            self._end_line()  # the other side's line was cut short
        if said.text and not self._line_open:
            self._out.write(f"{said.speaker}: {said.text.lstrip()}")
            self._line_open, self._speaker = True, said.speaker
        elif said.text:
            self._out.write(said.text)
        if said.ends_line and self._line_open:
            self._end_line()
        self._out.flush()

    def notice(self, text: str) -> None:
        self._clear_bar()
        if self._line_open and self._err_is_out():
            self._end_line()  # not in the middle of a transcript on the same screen
            self._out.flush()
        self._err.write(f"talk: {text}\n")
        self._err.flush()

    def progress(self, sent_s: float, total_s: float, answer_s: float, *,
                 force: bool = False) -> None:
        """Redraw the bar (at most every 0.1 s unless ``force``)."""
        if not self._bar or self._line_open:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < _REDRAW_S:
            return
        self._last_draw = now
        filled = round(_BAR_WIDTH * min(sent_s / total_s, 1.0)) if total_s else _BAR_WIDTH
        bar = "#" * filled + "." * (_BAR_WIDTH - filled)
        self._err.write(f"\r[{bar}] question {min(sent_s, total_s):.1f}/{total_s:.1f} s"
                        f"  answer {answer_s:.1f} s{self._status}\x1b[K")
        self._err.flush()
        self._bar_shown = True

    def status(self, text: str) -> None:
        """A word after the bar (``resuming``, ``waiting``...)."""
        self._status = f"  {text}" if text else ""

    def close(self) -> None:
        """End what is half written."""
        self._clear_bar()
        if self._line_open:
            self._end_line()
            self._out.flush()

    def _end_line(self) -> None:
        self._out.write("\n")
        self._line_open = False

    def _clear_bar(self) -> None:
        if self._bar_shown:
            self._err.write("\r\x1b[K")
            self._err.flush()
            self._bar_shown = False

    def _err_is_out(self) -> bool:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            return os.path.sameopenfile(self._out.fileno(), self._err.fileno())
        return False
