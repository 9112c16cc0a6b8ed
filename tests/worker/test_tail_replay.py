"""A taken-over session reconciled with its lost worker's tail (``tail_replay.py``).

A loopback core plays the lost worker: it checkpoints at a safe point, then applies more input
and writes events (the tail) until it is lost, mid-answer or between answers. A second core
restored from the checkpoint replays the same input: what it writes after the tail, with the
tail, must read as one conversation to the client: each response ends exactly once (the one
cut short ``failed`` ``worker_lost``), no audio twice, no id reused, and the session goes
on answering new turns. A replay that cannot reproduce the tail is refused, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from contract import messages as msg
from inference_worker.backends.registry import loopback_core
from inference_worker.conversation.checkpoint import decode, encode
from inference_worker.conversation.core import ConversationCore
from inference_worker.sessions import Session
from inference_worker.tail_replay import ReplayDiverged, TailMatch, event_key, replay_tail
from store.logs import InputEntry, WriteToken

pytestmark = pytest.mark.timeout(30)

T0 = 100.0
TOKEN = WriteToken("e1", 1)
#: 20 ms of a tone, marked by ``n`` so that each turn's answer is its own.
CHUNK_S = 0.02


def chunk(n: int) -> bytes:
    return b"".join(int(600 * math.sin((i + n * 37) / 5)).to_bytes(2, "little", signed=True)
                    for i in range(480))


MANUAL = msg.UpdateSession(session={"audio": {"input": {"turn_detection": None}}})


class LostWorker:
    """The lost worker's core: the commands it applied after its checkpoint, at the time each
    arrived, and the events it wrote."""

    def __init__(self) -> None:
        self.core = loopback_core("sess_lost")
        self.now = T0
        self.entries: list[InputEntry] = []
        self.tail: list[msg.Event] = []
        self.core.receive(MANUAL, self.now)
        self.core.events_to_send()
        self.state = self.core.checkpoint()
        assert self.state is not None

    def send(self, *commands: msg.Command) -> None:
        for command in commands:
            self.entries.append(InputEntry(index=len(self.entries) + 1,
                                           payload=msg.encode_message(command), token=TOKEN))
            self.core.receive(command, self.now)
            self.tail += self.core.events_to_send()
            if isinstance(command, msg.AppendAudio):
                self.advance(CHUNK_S)

    def advance(self, seconds: float) -> None:
        """Let the paced playback play on for ``seconds``."""
        until = self.now + seconds
        while (due := self.core.next_deadline()) is not None and due <= until:
            self.core.tick(due)
            self.tail += self.core.events_to_send()
        self.now = until

    def turn(self, n: int, chunks: int = 5) -> bytes:
        audio = [chunk(n * 100 + i) for i in range(chunks)]
        self.send(*[msg.AppendAudio(audio=a) for a in audio], msg.CommitInput(),
                  msg.CreateResponse())
        return b"".join(audio)

    def arrived_while_lost(self, *commands: msg.Command) -> None:
        """Input the gateway appended after the worker was lost: applied by nobody yet."""
        for command in commands:
            self.entries.append(InputEntry(index=len(self.entries) + 1,
                                           payload=msg.encode_message(command), token=TOKEN))


def adopter_of(lost: LostWorker) -> tuple[Session, ConversationCore]:
    core = loopback_core("sess_lost")
    state = lost.state
    assert state is not None
    core.restore(decode(encode(state)))
    return Session(core=core), core


def responses(events: Sequence[msg.Event]) -> tuple[list[str], list[tuple[str, str]]]:
    created = [str(e.response["id"]) for e in events if isinstance(e, msg.ResponseCreated)]
    done = [(str(e.response["id"]), str(e.response["status"])) for e in events
            if isinstance(e, msg.ResponseDone)]
    return created, done


def audio_of(events: Sequence[msg.Event]) -> bytes:
    return b"".join(e.audio for e in events if isinstance(e, msg.AudioDelta))


def go_on(session: Session, core: ConversationCore, entries: Sequence[InputEntry],
          now: float) -> list[msg.Event]:
    """Apply the entries the replay left to the usual path, and play out what they start."""
    events: list[msg.Event] = []
    for entry in entries:
        core.receive(msg.decode_command(entry.payload), now)
        events += core.events_to_send()
    while (due := core.next_deadline()) is not None:
        now = max(now, due)
        core.tick(now)
        events += core.events_to_send()
    return events


def test_an_answer_cut_short_by_the_loss_ends_once_and_the_session_goes_on() -> None:
    lost = LostWorker()
    first = lost.turn(1)
    lost.advance(1.0)  # answered in full: a completed response in the tail
    lost.turn(2, chunks=10)
    lost.advance(0.1)  # lost 100 ms into the second answer
    heard = audio_of(lost.tail)
    lost.arrived_while_lost(*[msg.AppendAudio(audio=chunk(900 + i)) for i in range(3)])
    session, core = adopter_of(lost)

    replayed = replay_tail(session, lost.entries, lost.tail, now=1000.0)

    created, done = responses(lost.tail)
    assert len(created) == 2 and len(done) == 1
    assert replayed.lost_response == created[1]
    assert replayed.applied == 19, "the tail's input replayed, what came after left"
    fresh = list(replayed.events)
    assert audio_of(fresh) == b"", "no audio the client heard comes again"
    assert responses(fresh) == ([], [(created[1], "failed")])
    (ended,) = [e for e in fresh if isinstance(e, msg.ResponseDone)]
    assert ended.response["status_details"] == {
        "type": "failed", "error": {"type": "server_error", "code": "worker_lost"}}
    assert heard.startswith(first)
    assert [(item.role, item.status) for item in core.history] == [
        ("user", "completed"), ("assistant", "completed"),
        ("user", "completed"), ("assistant", "incomplete")]
    heard_of_cut = sum(len(e.audio) for e in lost.tail
                       if isinstance(e, msg.AudioDelta) and e.response_id == created[1])
    assert heard_of_cut > 0
    assert core.history[-1].audio_bytes == heard_of_cut, (
        "the replay played the cut answer as far as the client heard it")

    later = go_on(session, core, lost.entries[replayed.applied:], 1000.0)
    assert later == [], "the audio that came while it was lost is buffered"
    entries = []
    third = [chunk(300 + i) for i in range(5)]
    commands: list[msg.Command] = [*[msg.AppendAudio(audio=a) for a in third],
                                   msg.CommitInput(), msg.CreateResponse()]
    for n, command in enumerate(commands):
        entries.append(InputEntry(index=100 + n, payload=msg.encode_message(command),
                                  token=TOKEN))
    later = go_on(session, core, entries, 1001.0)
    whole = lost.tail + fresh + later
    created, done = responses(whole)
    assert len(created) == len(set(created)) == 3
    assert sorted(created) == sorted(rid for rid, _ in done), "every response ends once"
    assert done[-1][1] == "completed"
    assert audio_of(later).endswith(b"".join(third))
    items = [e.item["id"] for e in whole if isinstance(e, msg.ItemAdded)]
    assert len(items) == len(set(items)), "no item id given twice"


def test_a_loss_between_answers_replays_to_the_tail_and_ends_nothing() -> None:
    """The tail holds a whole answer and the next turn's audio: the replay lets the answer
    end as it did, before the next turn, and nothing is left open to end."""
    lost = LostWorker()
    lost.turn(1)
    lost.advance(1.0)
    lost.send(*[msg.AppendAudio(audio=chunk(500 + i)) for i in range(4)])
    session, core = adopter_of(lost)

    replayed = replay_tail(session, lost.entries, lost.tail, now=1000.0)

    assert replayed.lost_response is None and replayed.events == ()
    assert replayed.applied == 7, "the turn and its answer; the next turn's audio left"
    assert [(item.role, item.status) for item in core.history] == [
        ("user", "completed"), ("assistant", "completed")]


def test_a_tail_the_replay_does_not_reproduce_is_refused() -> None:
    """A tail that holds an event the input cannot explain (another response id) is never
    continued on a guess."""
    lost = LostWorker()
    lost.turn(1)
    forged = [e for e in lost.tail]
    for n, event in enumerate(forged):
        if isinstance(event, msg.ResponseCreated):
            forged[n] = msg.ResponseCreated(response={**event.response, "id": "resp_other"})
    session, _ = adopter_of(lost)
    with pytest.raises(ReplayDiverged):
        replay_tail(session, lost.entries, forged, now=1000.0)


def test_deltas_are_loose_and_structural_events_are_keyed() -> None:
    delta = msg.AudioDelta(response_id="r", item_id="i", output_index=0, content_index=0,
                           audio=b"\0\0")
    assert event_key(delta) is None
    done = msg.ResponseDone(response={"id": "r", "status": "completed"})
    assert event_key(done) == ("response.done", "r", None, "completed")


def test_an_echo_driven_by_input_is_replayed_as_far_as_the_client_heard_it() -> None:
    """Stream mode echoes each append at once: the replay applies the appends whose echo the
    client got (the tail's structure is matched after the first), then ends the echo, and
    leaves the rest, whose echo nobody sent, to be applied as usual."""
    lost = LostWorker()
    lost.send(msg.UpdateSession(session={"extra_body": {"loopback_mode": "stream"}}))
    lost.send(*[msg.AppendAudio(audio=chunk(700 + i)) for i in range(5)])
    lost.arrived_while_lost(*[msg.AppendAudio(audio=chunk(800 + i)) for i in range(2)])
    assert len(audio_of(lost.tail)) == 5 * len(chunk(0))
    session, _ = adopter_of(lost)

    replayed = replay_tail(session, lost.entries, lost.tail, now=1000.0)

    assert replayed.applied == 6, "the update and the five echoed appends"
    assert replayed.lost_response is not None and audio_of(replayed.events) == b""


_SPEECH = bytes((i * 7 + 3) % 251 for i in range(4800)) * 2  # 100 ms, loud enough for the VAD
_QUIET = bytes(len(_SPEECH))


def test_a_turn_the_server_vad_heard_is_answered_once_across_the_loss() -> None:
    """Server VAD: the lost worker heard a turn (speech, then silence), committed it and began
    answering; the replay hears the same turn from the same audio (the detector runs on the
    audio, not the clock), matches every event, and ends the answer once."""
    lost = LostWorker()
    lost.send(msg.UpdateSession(session={"audio": {"input": {"turn_detection": {
        "type": "server_vad", "silence_duration_ms": 200}}}}))
    lost.send(*[msg.AppendAudio(audio=_SPEECH)] * 4, *[msg.AppendAudio(audio=_QUIET)] * 4)
    lost.advance(0.05)
    created, done = responses(lost.tail)
    assert len(created) == 1 and done == [], "lost mid-answer"
    assert any(isinstance(e, msg.InputSpeechStopped) for e in lost.tail)
    lost.arrived_while_lost(*[msg.AppendAudio(audio=_QUIET)] * 3)
    session, core = adopter_of(lost)

    replayed = replay_tail(session, lost.entries, lost.tail, now=1000.0)

    assert replayed.lost_response == created[0]
    assert responses(replayed.events) == ([], [(created[0], "failed")])
    assert replayed.applied <= len(lost.entries) - 3, "the audio after the loss left"
    later = go_on(session, core, lost.entries[replayed.applied:], 1000.0)
    assert responses(later) == ([], []), "the silence after it answers nothing"


def test_loose_events_of_no_response_are_sent_once_the_tail_is_matched() -> None:
    """An input transcript's delta belongs to no response: past the tail it is fresh, not
    taken for output of a response the client heard (there is none open)."""
    lost = LostWorker()
    lost.turn(1)
    lost.advance(1.0)
    match = TailMatch(lost.tail)
    assert match.take(lost.tail) == [] and match.matched and match.open_response is None
    delta = msg.InputTranscriptionDelta(item_id="item_9", content_index=0, delta="hi")
    assert match.take([delta]) == [delta]
