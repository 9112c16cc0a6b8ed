"""Every program in ``examples/`` runs as a newcomer runs it, ``python examples/NAME.py``,
against a ``duplex-gateway dev`` stack with the loopback backend, and prints what it promises.

``tests/test_examples_doc.py`` holds every file of ``examples/`` to a :func:`run_example` call
here, by reading this file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from duplex_gateway.wav import write_wav
from tests.worker.speech import synthesize, to_pcm16

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: Bytes of pcm16 mono 24 kHz audio per millisecond.
BYTES_PER_MS = 48


def run_example(name: str, base_url: str, *args: str) -> list[str]:
    """Run ``examples/<name>`` with ``args``, pointed at the stack by ``DUPLEX_GATEWAY_URL`` and
    with the default model; the lines it printed. It must exit 0 within 60 s."""
    env = {**os.environ, "DUPLEX_GATEWAY_URL": base_url}
    env.pop("DUPLEX_GATEWAY_MODEL", None)
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], env=env,
                          cwd=EXAMPLES.parent, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout.splitlines()


def test_sdk_turn_gets_its_tone_played_back(dev_stack: str) -> None:
    """The SDK turn: session.created, session.updated, a response, and the loopback plays the
    committed tone back whole."""
    lines = run_example("sdk_turn.py", dev_stack)
    assert lines[:3] == ["session.created", "session.updated", "input_audio_buffer.committed"]
    assert "response.created" in lines and "response.output_audio.delta" in lines
    assert lines[-2] == "response.done"
    done = re.fullmatch(r"completed: (\d+) audio bytes for (\d+) sent", lines[-1])
    assert done, lines[-1]
    assert int(done[1]) == int(done[2]) > 0


def test_sdk_server_vad_detects_the_turn_and_resumes_without_a_gap(
        dev_stack: str, tmp_path: Path) -> None:
    """The server_vad example with a spoken WAV: the server detects and commits the turn and
    answers it by itself; after the drop, the resume replays from the next event, the numbers
    run on without a gap, and the played-back audio is the whole detected turn."""
    speech, _ = synthesize("What is the weather like today?", 24_000)
    wav = tmp_path / "question.wav"
    write_wav(wav, bytes(24_000) + to_pcm16(speech))  # half a second of silence first
    lines = run_example("sdk_server_vad.py", dev_stack, str(wav))
    heard = {line.split()[0].removeprefix("input_audio_buffer."): int(line.split("=")[1])
             for line in lines if line.startswith("input_audio_buffer.speech_")}
    start, end = heard["speech_started"], heard["speech_stopped"]
    assert 0 <= start < end
    types = [line.split()[0] for line in lines]
    assert types.index("input_audio_buffer.speech_stopped") < types.index(
        "input_audio_buffer.committed") < types.index("response.created")
    dropped = next(line for line in lines if line.startswith("dropped the connection"))
    last_seen = int(dropped.rsplit(" ", 1)[1])
    resumed = next(line for line in lines if line.startswith("resumed "))
    assert resumed.endswith(f"replay from server_event_seq {last_seen + 1}"), resumed
    assert types.index("response.done") > types.index("session.resumed")
    done = re.fullmatch(r"response completed: (\d+) audio bytes; server_event_seq 1 to (\d+),"
                        r" each once and in order: True", lines[-1])
    assert done, lines[-1]
    assert int(done[2]) > last_seen
    assert int(done[1]) == (end - start) * BYTES_PER_MS, "the loopback plays the turn back"


def test_duplex_client_resumes_and_loses_nothing(dev_stack: str) -> None:
    """The DuplexClient example: one resume after its deliberate drop, the audio back exactly
    as sent, every event numbered 1 to N once, in order."""
    lines = run_example("resume_client.py", dev_stack)
    assert len(lines) == 2, lines
    assert re.fullmatch(r"resumed: replay from server_event_seq \d+", lines[0]), lines[0]
    done = re.fullmatch(r"(\d+) audio bytes, as sent: True; events 1 to (\d+), each once and"
                        r" in order: True", lines[1])
    assert done, lines[1]
    assert int(done[1]) > 0
    assert int(done[2]) > int(lines[0].rsplit(" ", 1)[1])
