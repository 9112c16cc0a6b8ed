"""`duplex-gateway dev`: real speech by default (the cascade backend), another backend on
request, the loopback where the cascade extra is missing; the URL only once a session can be
opened on it."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from duplex_client import DuplexClient, RealtimeEvent
from duplex_gateway import cli
from tests.e2e.helpers import collect_until, spoken_answer
from tests.e2e.stack import new_log_path, print_tail
from tests.worker.speech import from_pcm16, normalize, padded, synthesize, to_pcm16, transcribe

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

QUESTION = "What is the weather like today?"
RATE = 24_000
CHUNK = RATE * 2 // 10  # 100 ms of pcm16
# Runs dev as the command does, but with faster-whisper unfindable (a None entry in
# sys.modules makes importlib's find_spec answer None): a machine without the cascade extra.
WITHOUT_CASCADE = ("import sys; sys.modules['faster_whisper'] = None; "
                   "from duplex_gateway.cli import main; main(sys.argv[1:])")


@dataclass(frozen=True)
class Dev:
    """A running `dev`: its websocket URL and its stderr's log file."""

    url: str
    log: Path


@contextmanager
def running_dev(flags: Sequence[str] = (), *, program: Sequence[str] = ("-m", "duplex_gateway")
                ) -> Iterator[Dev]:
    """`dev --port 0 FLAGS` until the block ends, then SIGTERM, which must end it with 0."""
    # dev picks a free port itself (no race with one chosen here); its stderr, its children's
    # too, goes to the log folder, scanned for ERROR lines and secrets like a stack's.
    log = new_log_path("dev")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_GATEWAY_")}
    with log.open("wb") as sink:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [sys.executable, *program, "--log-level", "warning", "dev", "--port", "0",
             "--slots", "2", *flags], stdout=subprocess.PIPE, stderr=sink, text=True, env=env)
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()  # bounded by the test's timeout
        match = re.search(r"(ws://\S+/v1/realtime) \(redis ", banner)
        assert match, f"no URL line: {banner!r}"
        yield Dev(match.group(1), log)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
        print_tail("dev", log)
    assert code == 0, f"dev exited with {code} on SIGTERM"


async def ask(url: str, audio: bytes) -> tuple[bytes, list[RealtimeEvent]]:
    """Open a session the moment the URL is known, stream ``audio`` in 100 ms chunks, and
    read until the answer's ``response.done``; the answer's audio and every event."""
    events: list[RealtimeEvent] = []
    async with await DuplexClient.connect(url) as client:
        await collect_until(client, "session.updated", events)
        answer = await spoken_answer(client, audio, events, chunk_bytes=CHUNK)
    return answer, events


def voice_of(events: Sequence[RealtimeEvent]) -> str:
    """The voice the session reported (each backend serves its own)."""
    updated = next(event for event in events if event.type == "session.updated")
    voice: str = updated.data["session"]["audio"]["output"]["voice"]
    return voice


async def open_and_close(url: str) -> None:
    """A session opens at once (no refused connection, no resource_exhausted) and closes."""
    client = await DuplexClient.connect(url)
    assert client.session_id is not None
    await collect_until(client, "session.updated", [])
    await client.close()
    await collect_until(client, "session.closed", [])
    await client.aclose()


@pytest.mark.timeout(240)
async def test_by_default_a_spoken_question_gets_a_spoken_answer() -> None:
    """`dev` with no backend asked for runs the cascade: a session opened right after the URL
    line hears a Piper-spoken question, and the spoken answer, transcribed by Whisper, says
    what was heard and how long hearing it took."""
    speech, rate = synthesize(QUESTION, RATE)
    with running_dev() as dev:
        answer, events = await ask(dev.url, to_pcm16(padded(speech, rate, before_s=0.5,
                                                                   after_s=1.5)))
    assert voice_of(events) == "en_US-joe-medium"
    heard = normalize(transcribe(from_pcm16(answer), RATE))
    assert heard.startswith("you said"), heard
    assert "weather" in heard and "today" in heard and "seconds" in heard, heard


async def test_the_loopback_backend_on_request() -> None:
    """`dev --backend loopback`: the first session, opened the moment the URL line is printed,
    gets the loopback (its voice), and closes cleanly."""
    with running_dev(["--backend", "loopback"]) as dev:
        client = await DuplexClient.connect(dev.url)
        events: list[RealtimeEvent] = []
        await collect_until(client, "session.updated", events)
        await client.close()
        await collect_until(client, "session.closed", events)
        await client.aclose()
    assert voice_of(events) == "marin"


async def test_without_the_cascade_extra_it_falls_back_to_the_loopback_with_one_line() -> None:
    """Where the cascade's packages are missing and no backend was asked for, `dev` still
    serves (the loopback) and says once, on stderr, why and how to get real speech."""
    with running_dev(program=("-c", WITHOUT_CASCADE)) as dev:
        await open_and_close(dev.url)
        said = dev.log.read_text(errors="replace").splitlines()
    notes = [line for line in said if "running the loopback backend" in line]
    assert len(notes) == 1, said
    assert "'faster_whisper'" in notes[0]
    assert "pip install 'duplex-gateway[cascade]'" in notes[0]


def test_asking_for_the_cascade_without_its_extra_is_refused_in_one_line() -> None:
    """`--backend cascade` where its packages are missing: exit 2 before anything starts,
    one line naming the flag, the missing module and what to install."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_CASCADE, "dev", "--port", "0",
                           "--backend", "cascade"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "duplex-gateway: --backend: the cascade backend needs 'faster_whisper', which is not"
        " installed: pip install 'duplex-gateway[cascade]'"]


def test_an_unknown_backend_is_refused_in_one_line() -> None:
    """`dev --backend NAME` for no backend: exit 2, one line naming the flag and the choices."""
    done = subprocess.run([sys.executable, "-m", "duplex_gateway", "dev", "--port", "0",
                           "--backend", "tensorrt"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "duplex-gateway: --backend tensorrt: expected one of loopback, fake, moshi, cascade,"
        " recording"]


def _dev_args(*flags: str) -> argparse.Namespace:
    args: argparse.Namespace = cli._parser().parse_args(["dev", *flags])
    return args


def test_the_worker_gets_the_responder_and_model_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """`dev`'s --model-path, --backend-options, --device and --dtype reach its worker's
    command line, resolved over the variables."""
    for name in [k for k in os.environ if k.startswith("DUPLEX_GATEWAY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("DUPLEX_GATEWAY_BACKEND_OPTIONS", "responder=echo")
    args = _dev_args("--backend", "cascade", "--model-path", "/models/lm", "--dtype", "bfloat16")
    backend, note = cli._dev_backend(args, None)
    _, worker = cli._dev_settings(args, "redis://127.0.0.1:1/0", backend, None)
    flags = cli._dev_worker_flags(worker)
    pairs = dict(zip(flags[::2], flags[1::2], strict=True))
    assert note is None
    assert pairs == {"--redis-url": "redis://127.0.0.1:1/0", "--backend": "cascade",
                     "--slots": "16", "--drain-timeout": "1.0", "--device": "cpu",
                     "--dtype": "bfloat16", "--model-path": "/models/lm",
                     "--backend-options": "responder=echo"}
