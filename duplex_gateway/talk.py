"""``duplex-gateway talk``: say a WAV to a gateway, print both transcripts, save the answer.

The command is an ordinary client of the protocol (``duplex_client.DuplexClient``): it opens a
session with server-side turn detection and input transcription, streams the question in real
time as 20 ms ``input_audio_buffer.append`` chunks, then streams silence (the server's VAD
ends a turn on silence) until every turn it heard is answered, acknowledges what it received
of each answer with ``playback.ack``, closes the session and writes the answer's audio. A
dropped connection is resumed by the client, which delivers every event once and in order, so
the answer is whole across a resume.

Layout: the WAV reading and conversion live in :mod:`duplex_gateway.wav`, the answer's
bookkeeping in :mod:`duplex_gateway.talk_answer` (:class:`AnswerState`, fed one event at a
time, no I/O), the terminal output in :mod:`duplex_gateway.talk_console`; here, the session
itself (:class:`_Talk`) and the command. Only the standard library (and those modules, which
import only it) is imported here: ``add_arguments`` runs whenever any command starts, so
numpy, websockets and the client are imported inside the functions that need them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import math
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit, urlunsplit

from duplex_gateway.talk_answer import AnswerState, Notice, Said
from duplex_gateway.talk_console import Console
from duplex_gateway.wav import RATE, WavAudio, WavError, read_wav, write_wav

if TYPE_CHECKING:
    from duplex_client import DuplexClient, RealtimeEvent, Resumed

__all__ = [
    "API_KEY_VARIABLE",
    "Exit",
    "add_arguments",
    "run",
]

#: One append: 20 ms, what a microphone client sends.
_CHUNK_S: Final = 0.02
_CHUNK_BYTES: Final = round(RATE * _CHUNK_S) * 2
#: The variable the API key is read from when ``--api-key`` is not given (a flag is visible
#: to every user of the machine in the process list; a variable is not).
API_KEY_VARIABLE: Final = "DUPLEX_GATEWAY_API_KEY"
_DEFAULT_PATH: Final = "/v1/realtime"
#: What the session is opened with: the server decides when a turn ends and answers it, and
#: transcribes the user (a backend that cannot shows ``transcription: null``, and talk then
#: prints only the assistant's side).
_SESSION: Final[dict[str, Any]] = {
    "type": "realtime",
    "audio": {"input": {
        "transcription": {"model": "whisper-1"},
        "turn_detection": {"type": "server_vad", "create_response": True},
    }},
}


class Exit(enum.IntEnum):
    """The exit statuses of ``talk``; each failure prints one line saying why."""

    OK = 0
    USAGE = 2
    BAD_INPUT = 3
    UNREACHABLE = 4
    REFUSED = 5
    ENDED_BADLY = 6
    TIMEOUT = 7


_EXIT_MEANINGS: Final = {
    Exit.OK: "the answer was written to --output",
    Exit.USAGE: "a bad flag",
    Exit.BAD_INPUT: "--input is not a WAV talk reads (or --output cannot be written)",
    Exit.UNREACHABLE: "no gateway answered at --url, or the connection was lost and could"
                      " not be resumed within 30 s",
    Exit.REFUSED: "the gateway refused the API key (HTTP 401/403) or the session (an error"
                  " such as resource_exhausted)",
    Exit.ENDED_BADLY: "the session ended before the answer did (session.closed with a reason"
                      " other than client_close, session.expired, a close after an error, a"
                      " resume refused), the answer did not complete, or part of it was lost",
    Exit.TIMEOUT: "no complete answer within --timeout seconds after the question was sent",
}


class TalkFailed(Exception):
    """Why talk stops: ``code`` is its exit status, the message the one line it prints."""

    def __init__(self, code: Exit, message: str) -> None:
        super().__init__(message)
        self.code = code


def _check_writable(path: Path) -> None:
    """Refuse an --output that cannot be written, before a session is opened for nothing."""
    folder = path.parent
    if path.is_dir():
        raise TalkFailed(Exit.BAD_INPUT, f"--output {path} is a directory")
    if not folder.is_dir():
        raise TalkFailed(Exit.BAD_INPUT, f"--output {path}: no folder {folder}")
    if not os.access(folder, os.W_OK):
        raise TalkFailed(Exit.BAD_INPUT, f"--output {path}: cannot write in {folder}")


# --------------------------------------------------------------------------- the session


@dataclass(frozen=True, slots=True)
class TalkOptions:
    """The flags, checked."""

    urls: tuple[str, ...]
    input: Path
    output: Path
    api_key: str | None
    timeout_s: float


class _Talk:
    """One session: the question streamed by one task, the events read by another, and this
    object deciding when the answer is complete."""

    def __init__(self, client: DuplexClient, question: WavAudio, console: Console,
                 options: TalkOptions) -> None:
        self.client = client
        self.question = question
        self.console = console
        self.options = options
        self.state = AnswerState()
        self.sent_bytes = 0
        self.question_sent = False
        self.closing = False
        self.failure: TalkFailed | None = None
        self._changed = asyncio.Event()

    async def run(self) -> None:
        """Until the answer is complete and the session closed; raises :class:`TalkFailed`."""
        sender = asyncio.create_task(self._stream(), name="talk-stream")
        reader = asyncio.create_task(self._read(), name="talk-read")
        # The reader's end (the session's, or a failure) is news to the wait below too.
        reader.add_done_callback(lambda _: self._changed.set())
        try:
            await self._until_answered(reader)
            sender.cancel()
            if not reader.done():
                await self._close(reader)
        finally:
            for task in (sender, reader):
                task.cancel()
            await asyncio.gather(sender, reader, return_exceptions=True)
        self._judge(reader)

    async def _until_answered(self, reader: asyncio.Task[None]) -> None:
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while not reader.done() and not self.state.finished(self.question_sent):
            if self.question_sent and deadline is None:
                deadline = loop.time() + self.options.timeout_s
                self.console.notice(f"question sent ({self.question.duration_s:.1f} s);"
                                    " waiting for the answer")
            self._changed.clear()
            wait = None if deadline is None else max(deadline - loop.time(), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait)
            if deadline is not None and loop.time() >= deadline and not reader.done():
                self.failure = self._timed_out()
                return

    def _timed_out(self) -> TalkFailed:
        if self.state.responses_done or self.state.active_response:
            what = "the answer did not end"
        else:
            what = "no answer came"
        return TalkFailed(Exit.TIMEOUT, f"{what} within {self.options.timeout_s:g} s after"
                          " the question was sent")

    async def _close(self, reader: asyncio.Task[None]) -> None:
        """Acknowledge nothing more, close the session, and give its ``session.closed`` the
        client's close timeout to arrive (it is read by ``reader``)."""
        from duplex_client import DuplexClientError

        self.closing = True
        with contextlib.suppress(DuplexClientError):  # no close in time: the notice below says so
            await self.client.close()
        timeout = self.client.settings.close_timeout_s
        done, _ = await asyncio.wait({reader}, timeout=timeout)
        if not done and self.failure is None:
            self.console.notice(f"the session did not confirm its close within {timeout:g} s")

    async def _stream(self) -> None:
        """The question in real time, 20 ms a chunk on an absolute schedule, then silence."""
        loop = asyncio.get_running_loop()
        pcm = self.question.pcm16
        silence = bytes(_CHUNK_BYTES)
        start = loop.time()
        chunks = 0
        while True:
            chunk = pcm[self.sent_bytes:self.sent_bytes + _CHUNK_BYTES]
            await self.client.append_audio(chunk.ljust(_CHUNK_BYTES, b"\0") if chunk
                                           else silence)
            self.sent_bytes = min(self.sent_bytes + _CHUNK_BYTES, len(pcm))
            if self.sent_bytes >= len(pcm) and not self.question_sent:
                self.question_sent = True
                self._changed.set()
            self._draw()
            chunks += 1
            await asyncio.sleep(max(start + chunks * _CHUNK_S - loop.time(), 0.0))

    async def _read(self) -> None:
        from duplex_client import Resumed

        # Never left early: events() ends after the terminal event, and a cancellation runs
        # its clean-up as it passes through.
        async for event in self.client.events():
            if isinstance(event, Resumed):
                self._resumed(event)
            else:
                await self._take(event)
            self._changed.set()

    def _resumed(self, event: Resumed) -> None:
        self.console.notice(f"connection lost ({event.after}) with {self.state.answer_s:.2f} s"
                            f" of the answer received; resumed through {event.url} (attempt"
                            f" {event.attempts}), nothing lost")

    async def _take(self, event: RealtimeEvent) -> None:
        for output in self.state.apply(event.data):
            if isinstance(output, Said):
                self.console.said(output)
            elif isinstance(output, Notice):
                self.console.notice(output.text)
            elif not self.closing:  # Played: everything received was "heard" (written)
                await self.client.ack_playback(output.played_ms,
                                               response_id=output.response_id)
        self._draw()

    def _draw(self) -> None:
        if self.closing:
            self.console.status("closing")
        elif self.state.active_response is not None:
            self.console.status("answering")
        elif self.question_sent:
            self.console.status("waiting")
        self.console.progress(self.sent_bytes / (2 * RATE), self.question.duration_s,
                              self.state.answer_s)

    def _judge(self, reader: asyncio.Task[None]) -> None:
        """Raise the outcome's :class:`TalkFailed`, if it is one."""
        if self.failure is not None:
            raise self.failure
        # Closing began only once the answer was complete: what goes wrong after that costs
        # the answer nothing, and is said, not failed on.
        answered = self.closing
        if not reader.cancelled() and (error := reader.exception()) is not None:
            if not answered:
                raise _session_failure(error)
            self.console.notice(f"closing the session failed: {_session_failure(error)}")
        state = self.state
        if state.ended is not None and state.ended != "session.closed client_close":
            if not answered:
                raise TalkFailed(Exit.ENDED_BADLY, f"the session ended: {state.ended}")
            self.console.notice(f"the session ended {state.ended} as it was being closed")
        if not state.finished(self.question_sent):
            raise TalkFailed(Exit.ENDED_BADLY, "the session ended before the answer did")
        if state.lost is not None:
            raise TalkFailed(Exit.ENDED_BADLY, f"part of the answer was lost ({state.lost})")
        if state.last_status != "completed":
            raise TalkFailed(Exit.ENDED_BADLY, f"the answer ended {state.last_status}"
                             f" ({state.last_problem})")


def _session_failure(error: BaseException) -> TalkFailed:
    """The exit for what ``events()`` raised."""
    from duplex_client import DuplexClientError, ResumeRefused, RetriesExhausted

    if isinstance(error, RetriesExhausted):
        return TalkFailed(Exit.UNREACHABLE, f"lost the connection and could not resume: {error}")
    if isinstance(error, ResumeRefused):
        return TalkFailed(Exit.ENDED_BADLY, f"the gateway refused to resume the session"
                          f" ({error.code})")
    if isinstance(error, DuplexClientError):
        code = f", {error.code}" if error.code else ""
        close = f"close {error.close_code}" if error.close_code else "no close code"
        return TalkFailed(Exit.ENDED_BADLY, f"the session ended for this client: {error}"
                          f" ({close}{code})")
    return TalkFailed(Exit.ENDED_BADLY, f"the session failed: {error!r}")


async def _open(options: TalkOptions) -> DuplexClient:
    """The session, or :class:`TalkFailed` saying why there is none."""
    from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

    from duplex_client import DuplexClient, DuplexClientError

    where = options.urls[0]
    try:
        return await DuplexClient.connect(list(options.urls), session=_SESSION,
                                          api_key=options.api_key)
    except InvalidStatus as exc:
        status = exc.response.status_code
        if status in (401, 403):
            raise TalkFailed(Exit.REFUSED, f"{where} refused the API key (HTTP {status});"
                             f" pass --api-key or set {API_KEY_VARIABLE}") from None
        raise TalkFailed(Exit.UNREACHABLE, f"{where} answered HTTP {status} instead of a"
                         " websocket") from None
    except DuplexClientError as exc:
        raise TalkFailed(Exit.REFUSED, f"{where} refused the session ({exc.code})") from None
    except InvalidURI as exc:
        raise TalkFailed(Exit.USAGE, f"--url {where}: {exc}") from None
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise TalkFailed(Exit.UNREACHABLE, f"cannot reach a gateway at {where}:"
                         f" {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    """Why a connection failed, in plain words ("connection refused")."""
    # A refused connection's strerror quotes the address; its errno says it plainly. A name
    # that does not resolve has a resolver's code for errno, and its words in strerror.
    if isinstance(exc, OSError) and exc.errno and exc.errno > 0:
        return os.strerror(exc.errno).lower()
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


async def _talk(options: TalkOptions, question: WavAudio, console: Console) -> bytes:
    client = await _open(options)
    console.notice(f"session open at {client.url}; streaming {question.duration_s:.1f} s"
                   f" of {question.source.describe()} in real time")
    talk = _Talk(client, question, console, options)
    try:
        await talk.run()
    finally:
        await client.detach()  # the session is closed or given up by now: only the socket
    return bytes(talk.state.audio)


# --------------------------------------------------------------------------- the command


def _gateway_url(text: str) -> str:
    """A ws:// or wss:// URL; http(s) is taken for ws(s), a bare host gets /v1/realtime."""
    parts = urlsplit(text)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"expected ws://HOST:PORT/v1/realtime, got {text!r}")
    path = parts.path if parts.path not in ("", "/") else _DEFAULT_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the command, and its exit statuses in ``--help``."""
    parser.description = (
        "Stream a WAV to a gateway in real time (any rate and channel count, converted to"
        " pcm16 mono 24 kHz), print what the server heard and what it answers, and write the"
        " spoken answer to a WAV. A dropped connection is resumed.")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "exit status:\n" + "\n".join(
        textwrap.fill(meaning, width=88, initial_indent=f"  {int(code)}  ",
                      subsequent_indent=" " * 5)
        for code, meaning in _EXIT_MEANINGS.items())
    parser.add_argument("--url", action="append", type=_gateway_url, required=True,
                        help="the gateway's websocket URL, e.g. ws://127.0.0.1:8000/v1/realtime;"
                             " repeat it to name more gateways to resume through")
    parser.add_argument("--input", type=Path, required=True,
                        help="the question: a WAV, integer PCM (8/16/24/32-bit) or float"
                             " (32/64-bit), any rate and channel count")
    parser.add_argument("--output", type=Path, required=True,
                        help="where the answer goes: pcm16 mono 24 kHz WAV, written only on"
                             " success")
    parser.add_argument("--api-key",
                        help=f"the API key or client secret (ek_...); default: ${API_KEY_VARIABLE}")
    parser.add_argument("--timeout", type=_positive_seconds, default=60.0,
                        help="give up this many seconds after the question was sent"
                             " (default: 60)")


def run(args: argparse.Namespace) -> int:
    """Talk once; the exit status (see :class:`Exit`)."""
    console = Console(sys.stdout, sys.stderr, bar=sys.stderr.isatty())
    options = TalkOptions(urls=tuple(args.url), input=args.input, output=args.output,
                          api_key=args.api_key or os.environ.get(API_KEY_VARIABLE) or None,
                          timeout_s=args.timeout)
    try:
        try:
            question = read_wav(options.input)
        except WavError as exc:
            raise TalkFailed(Exit.BAD_INPUT, f"--input {options.input}: {exc}") from None
        _check_writable(options.output)
        answer = asyncio.run(_talk(options, question, console))
        try:
            write_wav(options.output, answer)
        except OSError as exc:
            raise TalkFailed(Exit.BAD_INPUT, f"cannot write --output {options.output}:"
                             f" {exc.strerror or exc}") from None
    except TalkFailed as failure:
        console.close()
        print(f"duplex-gateway talk: {failure}", file=sys.stderr)
        return int(failure.code)
    except KeyboardInterrupt:
        console.close()
        print("duplex-gateway talk: interrupted", file=sys.stderr)
        return 130
    console.close()
    console.notice(f"wrote {options.output}: {len(answer) / (2 * RATE):.2f} s of answer")
    return int(Exit.OK)
