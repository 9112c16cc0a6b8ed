"""pipecat and LiveKit, as their OpenAI Realtime integrations drive a session by default, replayed
through the official openai SDK against the loopback and the cascade (issue 10 acceptance).

Each flow is the sequence of client events the framework sends, as its public sources describe
it (pipecat ``services/openai/realtime``: ``llm.py`` and ``events.py``; LiveKit
``livekit-plugins-openai`` ``realtime/realtime_model.py`` and ``utils.py``, with
``livekit-agents`` ``voice/agent_activity.py``), written here as events, not as their code:

* **pipecat** (``OpenAIRealtimeLLMService`` with its server-side ``TurnDetection()``) connects
  with ``?model=gpt-realtime-2``. On ``session.created`` it sends one ``session.update``: its
  ``SessionProperties`` without the fields left unset (``type``, ``model``, ``instructions``,
  ``audio.input.transcription`` and ``.turn_detection``). It streams the transport's audio in
  20 ms appends, each with an ``event_id``, and lets the server detect and answer the turns.
  On ``input_audio_buffer.speech_started`` it truncates the answer still playing at the
  shorter of the wall-clock time since its first audio and the audio received; it sends no
  ``response.cancel`` (the server's ``interrupt_response`` cancels).
* **LiveKit** (``RealtimeModel()`` with its defaults: ``semantic_vad`` with
  ``create_response`` and ``interrupt_response``, voice ``marin``, ``gpt-4o-mini-transcribe``)
  connects with ``?model=gpt-realtime`` and sends its full ``session.update``, then the agent's
  instructions and its (empty) tools as two more. It streams 100 ms appends. On
  ``speech_started`` with a generation active (``response.created`` seen, its
  ``response.done`` not yet) it sends ``response.cancel``: the server has already cancelled
  the answer, so this is the benign ``response_cancel_not_active``. Once its playout stopped
  it truncates the message at the playback position (it deletes the message when nothing of
  it was heard).

Both speak as a user at a microphone does: audio in real time, silence between turns. The
user asks a question, then speaks over the answer as soon as it starts to play; the
conversation ends when the second question is answered. Every server event is validated
strictly (``tests/gateway/strict.py``), and no error but ``response_cancel_not_active`` is
allowed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, cast

import pytest
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection
from openai.types.realtime import RealtimeClientEventParam

from tests.e2e.served import SHOWN, Served, says_nearly
from tests.gateway.strict import validate_server_event
from tests.worker.speech import echoes, synthesize, to_pcm16

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ServerEvent = dict[str, Any]
ClientEvent = dict[str, Any]

QUESTION: Final = "What is the weather like today?"
INTERRUPTION: Final = "Tell me about the quick brown fox."
INSTRUCTIONS: Final = "You are a helpful assistant. Keep your answers short."
BENIGN_ERRORS: Final = frozenset({"response_cancel_not_active"})
#: How long one step of a conversation may take before the test gives up.
STEP_DEADLINE_S: Final = 30.0
BYTES_PER_MS: Final = 48  # pcm16 at 24 kHz
PCM_24K: Final = {"type": "audio/pcm", "rate": 24000}


def spoken(text: str) -> bytes:
    """``text`` spoken by Piper, pcm16 24 kHz."""
    speech, _ = synthesize(text, 24000)
    return to_pcm16(speech)


@pytest.fixture(scope="module")
def turns() -> tuple[bytes, bytes]:
    """The user's question, and what the user says over its answer."""
    return spoken(QUESTION), spoken(INTERRUPTION)


# --------------------------------------------------------------------------- the client side


@dataclass
class Playout:
    """An answer the framework is playing: from its first audio delta on, in real time.

    Attributes:
        item_id: the assistant item the audio belongs to.
        content_index: its content part.
        started: when its first delta arrived (event loop time, seconds).
        received: audio bytes received for it so far.
        generated_all: its response is done: nothing more will come.
    """

    item_id: str
    content_index: int
    started: float
    received: int = 0
    generated_all: bool = False

    def played_ms(self, now: float) -> int:
        """What the user has heard by ``now``: the wall-clock time since its first audio, but
        never more than the audio received."""
        return min(int((now - self.started) * 1000), self.received // BYTES_PER_MS)

    def finished(self, now: float) -> bool:
        """Whether it has played to its end (the framework's "bot stopped speaking")."""
        return self.generated_all and self.played_ms(now) * BYTES_PER_MS >= self.received


class Framework(ABC):
    """One framework's side of a session: what it sends unprompted, and in answer to the
    server's events. Every event it sends but its audio appends is kept in :attr:`sent`."""

    #: The model it names in the URL (``?model=``).
    model: ClassVar[str]
    #: The audio it appends at once, in milliseconds.
    chunk_ms: ClassVar[int]
    #: Its ``audio.input.turn_detection``.
    turn_detection: ClassVar[dict[str, Any]]

    def __init__(self) -> None:
        self.sent: list[ClientEvent] = []
        self._playout: Playout | None = None

    def connected(self) -> list[ClientEvent]:
        """What it sends as soon as the socket is open (before any server event)."""
        return []

    @abstractmethod
    def append(self, audio: bytes) -> ClientEvent:
        """Its ``input_audio_buffer.append`` of ``audio``."""

    def react(self, event: ServerEvent, now: float) -> list[ClientEvent]:
        """What it sends in answer to ``event``, received at ``now``."""
        kind = event["type"]
        if kind == "response.output_audio.delta":
            self._play(event, now)
        elif kind == "response.done" and self._playout is not None:
            self._playout.generated_all = True
        return []

    def _play(self, delta: ServerEvent, now: float) -> None:
        playout = self._playout
        if playout is None or playout.item_id != delta["item_id"] or playout.finished(now):
            playout = self._playout = Playout(item_id=delta["item_id"],
                                              content_index=delta["content_index"], started=now)
        playout.received += len(base64.b64decode(delta["delta"]))

    def _stop_playing(self, now: float) -> Playout | None:
        """The answer that was still playing at ``now``, which stops; None when none was."""
        playout, self._playout = self._playout, None
        return None if playout is None or playout.finished(now) else playout


def event_id(prefix: str = "") -> str:
    """A fresh client event id, after ``prefix`` (LiveKit names its events by what they do)."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


class Pipecat(Framework):
    """pipecat's ``OpenAIRealtimeLLMService`` with server-side turn detection."""

    model = "gpt-realtime-2"
    chunk_ms = 20
    turn_detection: ClassVar[dict[str, Any]] = {
        "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
        "silence_duration_ms": 500}

    def append(self, audio: bytes) -> ClientEvent:
        return {"event_id": str(uuid.uuid4()), "type": "input_audio_buffer.append",
                "audio": base64.b64encode(audio).decode()}

    def react(self, event: ServerEvent, now: float) -> list[ClientEvent]:
        super().react(event, now)
        if event["type"] == "session.created":
            return [{"event_id": str(uuid.uuid4()), "type": "session.update", "session": {
                "type": "realtime", "model": self.model, "instructions": INSTRUCTIONS,
                "audio": {"input": {"transcription": {"model": "gpt-realtime-whisper"},
                                    "turn_detection": self.turn_detection}}}}]
        if event["type"] == "input_audio_buffer.speech_started":
            playout = self._stop_playing(now)
            if playout is not None:
                return [{"event_id": str(uuid.uuid4()), "type": "conversation.item.truncate",
                         "item_id": playout.item_id, "content_index": playout.content_index,
                         "audio_end_ms": playout.played_ms(now)}]
        return []


class LiveKit(Framework):
    """LiveKit's ``RealtimeModel`` in an ``AgentSession``, with their defaults."""

    model = "gpt-realtime"
    chunk_ms = 100
    turn_detection: ClassVar[dict[str, Any]] = {
        "type": "semantic_vad", "create_response": True, "eagerness": "medium",
        "interrupt_response": True}

    def __init__(self) -> None:
        super().__init__()
        self._generating = False

    def connected(self) -> list[ClientEvent]:
        session = {
            "type": "realtime", "model": self.model, "output_modalities": ["audio"],
            "audio": {
                "input": {"format": dict(PCM_24K), "noise_reduction": None,
                          "transcription": {"model": "gpt-4o-mini-transcribe"},
                          "turn_detection": self.turn_detection},
                "output": {"format": dict(PCM_24K), "speed": 1.0, "voice": "marin"},
            },
            "max_output_tokens": "inf", "tool_choice": "auto", "tracing": None,
        }
        return [
            {"type": "session.update", "session": session,
             "event_id": event_id("session_update_")},
            {"type": "session.update", "event_id": event_id("instructions_update_"),
             "session": {"type": "realtime", "instructions": INSTRUCTIONS}},
            {"type": "session.update", "event_id": event_id("tools_update_"),
             "session": {"type": "realtime", "model": self.model, "tools": []}},
        ]

    def append(self, audio: bytes) -> ClientEvent:
        return {"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()}

    def react(self, event: ServerEvent, now: float) -> list[ClientEvent]:
        super().react(event, now)
        kind = event["type"]
        if kind in ("response.created", "response.done"):
            self._generating = kind == "response.created"
        if kind != "input_audio_buffer.speech_started":
            return []
        answer: list[ClientEvent] = []
        if self._generating:
            answer.append({"type": "response.cancel"})
        playout = self._stop_playing(now)
        if playout is None:
            return answer
        played = playout.played_ms(now)
        if played > 0:
            answer.append({"type": "conversation.item.truncate", "content_index": 0,
                           "item_id": playout.item_id, "audio_end_ms": played})
        else:
            answer.append({"type": "conversation.item.delete", "item_id": playout.item_id,
                           "event_id": event_id("chat_ctx_delete_")})
        return answer


class Microphone:
    """The user's microphone: audio in the framework's chunks, in real time, silence whenever
    the user says nothing. What it sent is the session's input timeline (:attr:`timeline`)."""

    def __init__(self, send: Callable[[bytes], Coroutine[Any, Any, None]],
                 chunk_ms: int) -> None:
        self.timeline = bytearray()
        self._send = send
        self._chunk_ms = chunk_ms
        self._speech = bytearray()

    def say(self, pcm: bytes) -> None:
        """The user says ``pcm`` once what they are saying now is said."""
        self._speech += pcm

    async def run(self) -> None:
        """Stream until cancelled."""
        loop = asyncio.get_running_loop()
        size = self._chunk_ms * BYTES_PER_MS
        due = loop.time()
        while True:
            chunk = bytes(self._speech[:size])
            del self._speech[:size]
            chunk += bytes(size - len(chunk))
            await self._send(chunk)
            self.timeline += chunk
            # Pacing the sender, not waiting for a condition: a live microphone has the next
            # chunk only a chunk later.
            due += self._chunk_ms / 1000
            await asyncio.sleep(max(0.0, due - loop.time()))


# --------------------------------------------------------------------------- the conversation


@dataclass
class Talk:
    """What a session gave the test: every server event, strictly valid, and the input
    timeline the microphone sent."""

    events: list[ServerEvent] = field(default_factory=list)
    timeline: bytes = b""

    def of(self, kind: str) -> list[ServerEvent]:
        """The server events of type ``kind``, in order."""
        return [event for event in self.events if event["type"] == kind]

    def error_codes(self) -> list[str]:
        return [str(event["error"]["code"]) for event in self.of("error")]


class Session:
    """A framework's session through the SDK: every server event read, validated, recorded
    and handed to the framework, whose answers are sent at once."""

    def __init__(self, conn: AsyncRealtimeConnection, framework: Framework) -> None:
        self.talk = Talk()
        self._conn = conn
        self._framework = framework
        self.microphone = Microphone(self._append, framework.chunk_ms)

    async def send(self, events: list[ClientEvent]) -> None:
        for event in events:
            self._framework.sent.append(event)
            await self._conn.send(cast(RealtimeClientEventParam, event))

    async def _append(self, audio: bytes) -> None:
        await self._conn.send(cast(RealtimeClientEventParam, self._framework.append(audio)))

    async def until(self, done: Callable[[ServerEvent], bool]) -> ServerEvent:
        """Read events until one that ``done`` accepts; returns it."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(STEP_DEADLINE_S):
            while True:
                event = json.loads(await self._conn.recv_bytes())
                validate_server_event(event)
                self.talk.events.append(event)
                await self.send(self._framework.react(event, loop.time()))
                if done(event):
                    return cast(ServerEvent, event)


def is_type(kind: str) -> Callable[[ServerEvent], bool]:
    return lambda event: event["type"] == kind


def completed(event: ServerEvent) -> bool:
    return bool(event["type"] == "response.done"
                and event["response"]["status"] == "completed")


async def converse(served: Served, framework: Framework, turns: tuple[bytes, bytes]) -> Talk:
    """The user asks the first of ``turns``, says the second over the answer as soon as it
    starts to play, and the conversation ends once that is answered."""
    question, interruption = turns
    client = AsyncOpenAI(api_key="sk-test", base_url="http://unused.invalid/v1",
                         websocket_base_url=served.base_url)
    async with client.realtime.connect(model=framework.model) as conn:
        session = Session(conn, framework)
        await session.send(framework.connected())
        streaming = asyncio.create_task(session.microphone.run())
        try:
            await session.until(is_type("session.updated"))
            session.microphone.say(question)
            await session.until(is_type("response.output_audio.delta"))
            session.microphone.say(interruption)
            await session.until(completed)
        finally:
            streaming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await streaming
    await client.close()
    session.talk.timeline = bytes(session.microphone.timeline)
    return session.talk


# --------------------------------------------------------------------------- the checks


def check_session(talk: Talk, framework: Framework, served: Served) -> None:
    """The framework's session.update applied whole: its turn detection, and the voice and
    transcription the backend really serves."""
    session = talk.of("session.updated")[0]["session"]
    shown = SHOWN[served.backend]
    detection = session["audio"]["input"]["turn_detection"]
    if shown.turn_detection is not None:  # the backend's own, whatever was asked
        assert detection == shown.turn_detection
    else:
        assert detection["type"] == framework.turn_detection["type"]
    assert session["audio"]["output"]["voice"] == shown.voice
    assert session["audio"]["input"]["transcription"] == shown.transcription
    assert talk.of("session.updated")[-1]["session"]["instructions"] == INSTRUCTIONS


def check_interruption(talk: Talk, framework: Framework) -> None:
    """The speech over the answer cancelled it (turn_detected), the framework's truncation at
    the played position was taken, and the interrupting turn got an answer in full."""
    cancelled, answered = talk.of("response.done")
    assert cancelled["response"]["status"] == "cancelled"
    assert cancelled["response"]["status_details"]["reason"] == "turn_detected"
    assert answered["response"]["status"] == "completed"
    [sent] = [event for event in framework.sent if event["type"] == "conversation.item.truncate"]
    [truncated] = talk.of("conversation.item.truncated")
    interrupted_item = cancelled["response"]["output"][0]["id"]
    assert sent["item_id"] == interrupted_item, "the framework truncates the answer it played"
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (interrupted_item,
                                                                 sent["audio_end_ms"])


def check_answer(talk: Talk, served: Served) -> None:
    """The answer that completed answers the interrupting turn: the loopback plays back that
    turn as it committed it; the cascade's echo responder says what Whisper heard in it."""
    answered = talk.of("response.done")[-1]["response"]
    if served.backend == "loopback":
        started = talk.of("input_audio_buffer.speech_started")[-1]
        stopped = talk.of("input_audio_buffer.speech_stopped")[-1]
        turn = talk.timeline[started["audio_start_ms"] * BYTES_PER_MS:
                             stopped["audio_end_ms"] * BYTES_PER_MS]
        audio = b"".join(base64.b64decode(event["delta"])
                         for event in talk.of("response.output_audio.delta")
                         if event["response_id"] == answered["id"])
        assert audio == turn, "the loopback answers with the turn it heard"
        return
    heard = talk.of("conversation.item.input_audio_transcription.completed")[-1]["transcript"]
    said = answered["output"][0]["content"][0]["transcript"]
    assert says_nearly(INTERRUPTION, heard), heard
    assert echoes(said, heard), f"the echo responder says what it heard: {said!r}"


# --------------------------------------------------------------------------- the tests


async def test_pipecat_flow(served: Served, turns: tuple[bytes, bytes]) -> None:
    """pipecat's flow: its session.update applies whole, the server hears and answers the
    question, the user's speech over the answer cancels it and pipecat's truncation at the
    played position is taken, the interruption is answered, and there is no error at all
    (pipecat sends no response.cancel of its own)."""
    framework = Pipecat()
    talk = await converse(served, framework, turns)
    assert talk.error_codes() == []
    check_session(talk, framework, served)
    check_interruption(talk, framework)
    check_answer(talk, served)


async def test_livekit_flow(served: Served, turns: tuple[bytes, bytes]) -> None:
    """LiveKit's flow: its three session.updates apply, the server hears and answers the
    question, the user's speech over the answer cancels it; LiveKit's own response.cancel
    then finds nothing active, the one error, benign (response_cancel_not_active), and its
    truncation at the played position is taken; the interruption is answered."""
    framework = LiveKit()
    talk = await converse(served, framework, turns)
    assert set(talk.error_codes()) <= BENIGN_ERRORS
    assert talk.error_codes() == ["response_cancel_not_active"], "its cancel came too late"
    check_session(talk, framework, served)
    check_interruption(talk, framework)
    check_answer(talk, served)
