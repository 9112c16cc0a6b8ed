"""``duplex-gateway talk`` as a user runs it: a real process against a real gateway and a
cascade worker, a Piper-spoken question in, the spoken answer out, heard back by Whisper."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import wave
from difflib import SequenceMatcher
from pathlib import Path

import numpy as np
import pytest

from duplex_gateway.talk import API_KEY_VARIABLE
from runtime.embedded import free_port
from tests.e2e.stack import Stack
from tests.faultproxy import FaultProxy
from tests.worker.speech import normalize, padded, synthesize, transcribe

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

QUESTION = "What is the weather like today?"
TALK = [sys.executable, "-m", "duplex_gateway", "talk"]


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The question spoken by Piper at its own rate (22.05 kHz), as a stereo 16-bit WAV: what
    talk has to convert before it streams."""
    speech, rate = synthesize(QUESTION)
    pcm = (np.clip(padded(speech, rate, before_s=0.3, after_s=0.3), -1, 1) * 32767)
    samples = pcm.astype("<i2")
    path = tmp_path_factory.mktemp("talk") / "question.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(np.repeat(samples, 2).tobytes())
    return path


def words(text: str) -> list[str]:
    """The words of a transcript made of letters only: numbers are left out, since Piper
    speaks "2.5" as words that Whisper may write back as digits or as words."""
    return [word for word in normalize(text).split() if word.isalpha()]


def assistant_said(stdout: str) -> str:
    """Everything talk printed as the assistant's transcript."""
    return " ".join(line.removeprefix("assistant: ") for line in stdout.splitlines()
                    if line.startswith("assistant: "))


def heard_in(answer: Path) -> str:
    """What Whisper hears in the answer WAV talk wrote (checked to be 24 kHz mono pcm16)."""
    with wave.open(str(answer), "rb") as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24000, 1, 2)
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
    return transcribe((pcm / 32768).astype(np.float32), 24000)


def assert_answer_is_whole(printed: str, heard: str) -> None:
    """The rule for two recognisers and a synthesiser in a row: at least 85% of the words talk
    printed are heard, in order, and the answer's last word is among the last three heard (so
    the end of the answer is in the file, not only most of it)."""
    said, got = words(printed), words(heard)
    assert said, f"talk printed no assistant transcript: {printed!r}"
    same = sum(block.size for block in SequenceMatcher(None, said, got).get_matching_blocks())
    assert same >= 0.85 * len(said), f"printed {printed!r}, heard {heard!r}"
    assert said[-1] in got[-3:], f"the end is missing: printed {printed!r}, heard {heard!r}"


def assert_heard_the_question(stdout: str) -> None:
    """talk printed the server's transcript of the question: every word but at most one."""
    user = " ".join(line.removeprefix("you: ") for line in stdout.splitlines()
                    if line.startswith("you: "))
    said, got = words(QUESTION), words(user)
    same = sum(block.size for block in SequenceMatcher(None, said, got).get_matching_blocks())
    assert same >= len(said) - 1, stdout


def test_talk_writes_the_spoken_answer(cascade_stack: str, question: Path,
                                       tmp_path: Path) -> None:
    """A Piper question through talk: exit 0, both transcripts printed, and the answer WAV
    says what talk printed as the assistant's transcript."""
    answer = tmp_path / "answer.wav"
    done = subprocess.run([*TALK, "--url", f"{cascade_stack}/realtime", "--input",
                           str(question), "--output", str(answer)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert_heard_the_question(done.stdout)
    assert_answer_is_whole(assistant_said(done.stdout), heard_in(answer))
    assert "resumed" not in done.stderr


async def read_until(stream: asyncio.StreamReader, marker: str, seen: bytearray) -> None:
    """Read ``stream`` into ``seen`` until ``marker`` appears (talk flushes every piece)."""
    while marker.encode() not in seen:
        piece = await stream.read(256)
        assert piece, f"the stream ended before {marker!r}: {seen.decode()!r}"
        seen += piece


async def test_talk_resumes_a_connection_dropped_mid_answer(cascade_stack: str, question: Path,
                                                           tmp_path: Path) -> None:
    """The connection between talk and the gateway is cut once the answer has begun to
    arrive: talk resumes by itself, exits 0, and the WAV holds the whole answer."""
    gateway_port = int(cascade_stack.rsplit(":", 1)[1].split("/")[0])
    proxy = FaultProxy("127.0.0.1", gateway_port)
    await proxy.start()
    proxy_port = int(proxy.url.rsplit(":", 1)[1].split("/")[0])
    answer = tmp_path / "answer.wav"
    talk = await asyncio.create_subprocess_exec(
        *TALK, "--url", f"ws://127.0.0.1:{proxy_port}/v1/realtime", "--input", str(question),
        "--output", str(answer), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        assert talk.stdout is not None
        seen = bytearray()
        await asyncio.wait_for(read_until(talk.stdout, "assistant: ", seen), 120)
        proxy.cut()  # every connection through the proxy drops, mid-answer
        proxy.restore()  # and the next one gets through
        rest, errors = await asyncio.wait_for(talk.communicate(), 120)
    finally:
        if talk.returncode is None:
            talk.kill()
            await talk.wait()
        await proxy.aclose()
    stdout, stderr = (seen + rest).decode(), errors.decode()
    assert talk.returncode == 0, stderr
    resumed = re.search(r"with ([\d.]+) s of the answer received; resumed through", stderr)
    written = re.search(r"wrote .*: ([\d.]+) s of answer", stderr)
    assert resumed and written, stderr
    assert float(resumed.group(1)) < float(written.group(1)), "the drop came after the answer"
    assert_answer_is_whole(assistant_said(stdout), heard_in(answer))


def silent_question(tmp_path: Path) -> Path:
    """A question with no speech in it: 0.2 s of silence at 16 kHz."""
    question = tmp_path / "question.wav"
    with wave.open(str(question), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(bytes(6400))
    return question


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def test_talk_without_a_gateway_says_why(tmp_path: Path) -> None:
    """Nothing listens at --url: exit 4 with one line naming the URL and the reason, and no
    answer file."""
    question = silent_question(tmp_path)
    url = f"ws://127.0.0.1:{free_port()}/v1/realtime"
    answer = tmp_path / "answer.wav"
    done = subprocess.run([*TALK, "--url", url, "--input", str(question), "--output",
                           str(answer)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 4, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0] and "refused" in lines[0], done.stderr
    assert not answer.exists()


def test_talk_needs_the_key_and_gives_up_on_no_answer(stack: Stack, tmp_path: Path) -> None:
    """With API keys on, talk without one is refused (exit 5, HTTP 401 named); with the key in
    DUPLEX_GATEWAY_API_KEY it gets a session, and a question nobody answers (no speech in it)
    ends after --timeout with exit 7, and no answer file."""
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = "talk-test-key"
    gateway = stack.gateway()
    stack.worker(slots=1)
    question, answer = silent_question(tmp_path), tmp_path / "answer.wav"
    command = [*TALK, "--url", gateway.ws_url, "--input", str(question), "--output", str(answer)]
    without_key = {name: value for name, value in os.environ.items()
                   if name != API_KEY_VARIABLE}
    refused = subprocess.run(command, env=without_key, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 5, refused.stderr
    assert "HTTP 401" in last_line(refused.stderr)
    unanswered = subprocess.run([*command, "--timeout", "1"],
                                env={**without_key, API_KEY_VARIABLE: "talk-test-key"},
                                capture_output=True, text=True, timeout=60)
    assert unanswered.returncode == 7, unanswered.stderr
    assert "no answer came within 1 s" in last_line(unanswered.stderr)
    assert not answer.exists()


async def test_talk_reports_a_session_that_ends_badly(stack: Stack, tmp_path: Path) -> None:
    """The worker dies while talk waits for its answer: the session ends worker_lost, and
    talk exits 6 with a last line naming it."""
    gateway = stack.gateway()
    worker = stack.worker(slots=1)
    talk = await asyncio.create_subprocess_exec(
        *TALK, "--url", gateway.ws_url, "--input", str(silent_question(tmp_path)),
        "--output", str(tmp_path / "answer.wav"), "--timeout", "120",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        assert talk.stderr is not None
        seen = bytearray()
        await asyncio.wait_for(read_until(talk.stderr, "waiting for the answer", seen), 60)
        worker.kill()
        _, rest = await asyncio.wait_for(talk.communicate(), 60)
    finally:
        if talk.returncode is None:
            talk.kill()
            await talk.wait()
    stderr = (seen + rest).decode()
    assert talk.returncode == 6, stderr
    assert last_line(stderr) == "duplex-gateway talk: the session ended: session.closed worker_lost"
