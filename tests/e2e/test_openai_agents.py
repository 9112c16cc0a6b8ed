"""OpenAI's agents framework (openai-agents) holds a spoken conversation with the loopback of a
dev stack and with a cascade worker (issue 10 acceptance).

``agents.realtime.RealtimeRunner`` runs with its default settings (voice ``ash``,
``gpt-4o-mini-transcribe``, ``semantic_vad`` with ``interrupt_response``), pointed at the
gateway by its ``url`` model option, and naming the model it names by default: a session
takes the first model name a client gives it (the deployment's name for its backend).

The loopback answers a turn by playing it back; the cascade hears it with its own Silero VAD
and Whisper and answers with its ``echo`` responder, which says back what Whisper heard.

The framework validates every server event strictly and turns one that fails, like every
``error`` event, into an error event of its own: each test fails on any of them but the benign
``response_cancel_not_active``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from agents import set_tracing_disabled
from agents.realtime import (
    RealtimeAgent,
    RealtimeAudio,
    RealtimeAudioInterrupted,
    RealtimeError,
    RealtimeModelConfig,
    RealtimeRawModelEvent,
    RealtimeRunner,
    RealtimeSession,
    RealtimeSessionEvent,
)

from tests.e2e.served import SHOWN, Served, says_nearly
from tests.worker.speech import echoes, synthesize, to_pcm16

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SENTENCE = "What is the weather like today?"
#: How long one step of a conversation may take before the test gives up.
STEP_DEADLINE_S = 30.0
BENIGN_ERRORS = frozenset({"response_cancel_not_active"})
BYTES_PER_MS = 48  # pcm16 at 24 kHz
ServerEvent = dict[str, Any]


@pytest.fixture(autouse=True)
def no_local_tracing() -> Iterator[None]:
    """The framework's own trace exporter would post to OpenAI; these tests run offline.
    (This is not the ``tracing`` session setting, which the framework still sends.)"""
    set_tracing_disabled(True)
    yield


@pytest.fixture(scope="module")
def spoken_turn() -> bytes:
    """A spoken question with silence around it, pcm16 24 kHz: 0.5 s before, 1.5 s after
    (longer than semantic_vad's end-of-turn silence)."""
    speech, _ = synthesize(SENTENCE, 24000)
    pcm = to_pcm16(speech)
    return bytes(500 * BYTES_PER_MS) + pcm + bytes(1500 * BYTES_PER_MS)


def model_config(base_url: str) -> RealtimeModelConfig:
    """The gateway as the framework's model: its url, the rest the framework's defaults."""
    return {"url": f"{base_url}/realtime", "api_key": "sk-test"}


@dataclass
class Conversation:
    """What the framework's session gave the test: the server events it received, its
    error events, the audio it played and its playback interruptions."""

    events: AsyncIterator[RealtimeSessionEvent]
    server: list[ServerEvent] = field(default_factory=list)
    errors: list[Any] = field(default_factory=list)
    audio: bytearray = field(default_factory=bytearray)
    interruptions: int = 0

    async def until(self, done: Callable[[ServerEvent], bool]) -> ServerEvent:
        """Read the session's events until a server event that ``done`` accepts."""
        async with asyncio.timeout(STEP_DEADLINE_S):
            while True:
                event = await anext(self.events)
                if self._record(event) and done(self.server[-1]):
                    return self.server[-1]

    def _record(self, event: RealtimeSessionEvent) -> bool:
        """Keep what ``event`` says; True when it was a server event."""
        if isinstance(event, RealtimeError):
            self.errors.append(event.error)
        elif isinstance(event, RealtimeAudio):
            self.audio += event.audio.data
        elif isinstance(event, RealtimeAudioInterrupted):
            self.interruptions += 1
        elif isinstance(event, RealtimeRawModelEvent) and event.data.type == "raw_server_event":
            self.server.append(event.data.data)
            return True
        return False

    def of(self, kind: str) -> list[ServerEvent]:
        """The server events of type ``kind``, in order."""
        return [event for event in self.server if event["type"] == kind]

    def unexpected_errors(self) -> list[str]:
        """Every error event but the benign ones (a validation failure has no code)."""
        return [repr(error) for error in self.errors
                if getattr(error, "code", None) not in BENIGN_ERRORS]


def is_type(kind: str) -> Callable[[ServerEvent], bool]:
    return lambda event: event["type"] == kind


def completed(event: ServerEvent) -> bool:
    return bool(event["type"] == "response.done"
                and event["response"]["status"] == "completed")


async def start(session: RealtimeSession) -> Conversation:
    """The conversation of an entered session, read up to its configured session."""
    conversation = Conversation(events=aiter(session))
    await conversation.until(is_type("session.updated"))
    return conversation


def echoed(talk: Conversation) -> tuple[str, str]:
    """The cascade's last turn: what Whisper heard the user say, and what the answer said."""
    heard = talk.of("conversation.item.input_audio_transcription.completed")[-1]
    said = talk.of("response.output_audio_transcript.done")[-1]
    return str(heard["transcript"]), str(said["transcript"])


async def test_agents_runner_answers_a_spoken_turn(served: Served, spoken_turn: bytes) -> None:
    """A spoken turn with the framework's defaults: its session.update applies whole (voice
    and transcription shown as the backend really serves them), semantic_vad hears the turn,
    the automatic response answers it (the loopback plays the turn back, the cascade says
    what Whisper heard), and nothing is an error."""
    runner = RealtimeRunner(RealtimeAgent(name="assistant", instructions="Answer briefly."))
    async with await runner.run(model_config=model_config(served.base_url)) as session:
        talk = await start(session)
        await session.send_audio(spoken_turn)
        done = await talk.until(is_type("response.done"))
    assert talk.unexpected_errors() == []
    session_object = talk.of("session.updated")[0]["session"]
    shown = SHOWN[served.backend]
    assert session_object["audio"]["output"]["voice"] == shown.voice  # asked for: ash
    assert session_object["audio"]["input"]["transcription"] == shown.transcription
    detection = session_object["audio"]["input"]["turn_detection"]
    if shown.turn_detection is not None:  # the cascade's own VAD, whatever was asked
        assert detection == shown.turn_detection
    else:
        assert detection["type"] == "semantic_vad"
    assert session_object["instructions"] == "Answer briefly."
    assert done["response"]["status"] == "completed"
    [started] = talk.of("input_audio_buffer.speech_started")
    [stopped] = talk.of("input_audio_buffer.speech_stopped")
    if served.backend == "loopback":
        turn = spoken_turn[started["audio_start_ms"] * BYTES_PER_MS:
                           stopped["audio_end_ms"] * BYTES_PER_MS]
        assert bytes(talk.audio) == turn, "the loopback answers with the turn it heard"
    else:
        heard, said = echoed(talk)
        assert says_nearly(SENTENCE, heard), heard
        assert echoes(said, heard), f"the echo responder says what it heard: {said!r}"
        assert talk.audio, "and speaks it"


async def test_agents_runner_is_interrupted_by_speech_during_its_answer(
        served: Served, spoken_turn: bytes) -> None:
    """Speech while the answer plays: the server cancels the answer (turn_detected), the
    framework stops its playback and truncates the answer where it stopped hearing it (answered
    by conversation.item.truncated, not an error), and the new turn is answered in full."""
    runner = RealtimeRunner(RealtimeAgent(name="assistant"))
    async with await runner.run(model_config=model_config(served.base_url)) as session:
        talk = await start(session)
        await session.send_audio(spoken_turn)
        first = await talk.until(is_type("response.output_audio.delta"))
        await session.send_audio(spoken_turn)  # the user speaks over the answer
        await talk.until(completed)
        truncated = talk.of("conversation.item.truncated") or [
            await talk.until(is_type("conversation.item.truncated"))]
    assert talk.unexpected_errors() == []
    cancelled, answered = talk.of("response.done")
    assert cancelled["response"]["status"] == "cancelled"
    assert cancelled["response"]["status_details"]["reason"] == "turn_detected"
    assert answered["response"]["status"] == "completed"
    assert talk.interruptions >= 1, "the framework stopped playing the interrupted answer"
    assert [event["item_id"] for event in truncated] == [first["item_id"]]
    if served.backend == "cascade":
        heard, said = echoed(talk)
        assert says_nearly(SENTENCE, heard), heard
        assert echoes(said, heard), f"the new turn is the one answered: {said!r}"


async def test_agents_runner_interrupt_stops_the_answer(served: Served,
                                                        spoken_turn: bytes) -> None:
    """``RealtimeSession.interrupt()`` while the answer plays (a client's stop button): the
    framework truncates the playing item, which ends the response cancelled
    (client_cancelled), and nothing is an error."""
    runner = RealtimeRunner(RealtimeAgent(name="assistant"))
    async with await runner.run(model_config=model_config(served.base_url)) as session:
        talk = await start(session)
        await session.send_audio(spoken_turn)
        first = await talk.until(is_type("response.output_audio.delta"))
        await session.interrupt()
        done = await talk.until(is_type("response.done"))
        [truncated] = talk.of("conversation.item.truncated") or [
            await talk.until(is_type("conversation.item.truncated"))]
    assert talk.unexpected_errors() == []
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "client_cancelled"
    assert truncated["item_id"] == first["item_id"]
    assert talk.interruptions >= 1
