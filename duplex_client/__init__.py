"""A Python client for the gateway: typed commands in, typed events out, resume built in.

It needs only ``websockets``: nothing of the server (its web framework, its Redis client) is
imported with it.

Method names and arguments follow the seed's ``DuplexSessionHandle`` (``append_audio``,
``append_text``, ``commit``, ``create_response``, ``cancel_input``, ``cancel_response``,
``barge_in``, ``signal_turn``, ``ack_playback``, ``close``, ``events()``); each command is
:meth:`DuplexClient.submit` of one typed command of :mod:`duplex_client.commands`, and a
command after the session ended raises :class:`SessionClosedError` (``session_closed``). Events
are typed by their ``type`` (:mod:`duplex_client.events`: ``isinstance(event, AudioDelta)``).
``dialect="duplex"`` speaks the seed's ``?duplex=1`` contract (:mod:`duplex_client.dialect`);
:meth:`DuplexClient.resume_session` takes a session over from ``(session_id, resume_token)``.

Exactly once, both directions, across lost connections:

* **Upstream.** Every command carries ``client_seq`` 1, 2, 3, ... and stays in a resend buffer.
  ``session.resumed`` reports the highest ``client_seq`` the input log holds; the client resends
  everything after it, in order, and the store drops anything it already has.
* **Downstream.** The client remembers the highest ``server_event_seq`` it handed out, resumes
  from it, and drops any event at or below it.

Two ways to read:

* :meth:`DuplexClient.events` keeps the session going by itself. On a dropped connection (no
  close frame) or a close with 1011, 1012 or 1013 it reconnects (to the next of its URLs, with
  jittered exponential backoff), resumes with one ``control_id`` kept across that resume's
  retries, resends what the gateway lacks and yields a :class:`Resumed` marker where the resume
  happened. It ends after the session's terminal event, and raises a
  :class:`DuplexClientError` only when no retry can help (see :class:`ResumeRefused`,
  :class:`SessionReplaced`, :class:`RetriesExhausted`).
* :meth:`DuplexClient.recv` is the low-level call: the next event of the current connection,
  raising ``ConnectionClosed`` when it drops; :meth:`DuplexClient.resume` is then one resume.

Ending: :meth:`DuplexClient.close` ends the session and returns once its terminal event came
(see there for who reads the events meanwhile); :meth:`DuplexClient.wait_closed` only waits;
:meth:`DuplexClient.detach` only closes the connection, leaving the session resumable. Leaving
``async with`` closes the session, as the seed's handle does.

Example (push-to-talk: a new session starts with OpenAI's ``server_vad``, which answers the
turns it hears by itself; ``turn_detection: null`` leaves committing and answering to the
client)::

    urls = ["ws://gw-a/v1/realtime", "ws://gw-b/v1/realtime"]
    push_to_talk = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    async with await DuplexClient.connect(urls, session=push_to_talk) as client:
        await client.submit(InputAudioBufferAppendEvent(pcm))
        await client.submit(InputAudioBufferCommitEvent())
        await client.submit(ResponseCreateEvent())
        async for event in client.events():
            if isinstance(event, Resumed):
                continue  # nothing lost: the events go on where they stopped
            if isinstance(event, ResponseDone):
                break
    # here the session is closed: session.close went out and session.closed came back
"""

from __future__ import annotations

from duplex_client.client import DuplexClient
from duplex_client.commands import (
    APPEND_HINT_KEYS,
    BargeInEvent,
    ClientCommand,
    CommandMethods,
    ConversationItemCreateEvent,
    ConversationItemDeleteEvent,
    ConversationItemRetrieveEvent,
    ConversationItemTruncateEvent,
    InputAudioBufferAppendEvent,
    InputAudioBufferClearEvent,
    InputAudioBufferCommitEvent,
    InputCancelEvent,
    InputTextAppendEvent,
    OutputAudioBufferClearEvent,
    PlaybackAckEvent,
    ResponseCancelEvent,
    ResponseCreateEvent,
    SessionCloseEvent,
    SessionEventAckEvent,
    SessionHeartbeatEvent,
    SessionUpdateEvent,
    TurnSignalEvent,
)
from duplex_client.dialect import Dialect
from duplex_client.errors import (
    DuplexClientError,
    ResumeRefused,
    RetriesExhausted,
    SessionClosedError,
    SessionReplaced,
)
from duplex_client.events import (
    AudioDelta,
    ErrorEvent,
    InputCommitted,
    ListenDecision,
    PlaybackAcknowledged,
    RealtimeEvent,
    ResponseCreated,
    ResponseDone,
    Resumed,
    SessionClosed,
    SessionCreated,
    SessionExpired,
    SessionResyncRequired,
    SessionUpdated,
    SpeakDecision,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TranscriptDelta,
    TurnEvent,
)
from duplex_client.retry import ClientSettings

__all__ = [
    "APPEND_HINT_KEYS",
    "AudioDelta",
    "BargeInEvent",
    "ClientCommand",
    "ClientSettings",
    "CommandMethods",
    "ConversationItemCreateEvent",
    "ConversationItemDeleteEvent",
    "ConversationItemRetrieveEvent",
    "ConversationItemTruncateEvent",
    "Dialect",
    "DuplexClient",
    "DuplexClientError",
    "ErrorEvent",
    "InputAudioBufferAppendEvent",
    "InputAudioBufferClearEvent",
    "InputAudioBufferCommitEvent",
    "InputCancelEvent",
    "InputCommitted",
    "InputTextAppendEvent",
    "ListenDecision",
    "OutputAudioBufferClearEvent",
    "PlaybackAckEvent",
    "PlaybackAcknowledged",
    "RealtimeEvent",
    "ResponseCancelEvent",
    "ResponseCreateEvent",
    "ResponseCreated",
    "ResponseDone",
    "ResumeRefused",
    "Resumed",
    "RetriesExhausted",
    "SessionCloseEvent",
    "SessionClosed",
    "SessionClosedError",
    "SessionCreated",
    "SessionEventAckEvent",
    "SessionExpired",
    "SessionHeartbeatEvent",
    "SessionReplaced",
    "SessionResyncRequired",
    "SessionUpdateEvent",
    "SessionUpdated",
    "SpeakDecision",
    "SpeechStarted",
    "SpeechStopped",
    "TextDelta",
    "TranscriptDelta",
    "TurnEvent",
    "TurnSignalEvent",
]
