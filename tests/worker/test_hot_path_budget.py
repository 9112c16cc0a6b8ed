"""The relay's hot path through the worker's session table, counted in calls per chunk.

The worker's relay shares its process with the model, and issue 13 measures its CPU target in
Python calls per chunk (``bench relay --profile``): on a shared machine a few microseconds
never show in CPU time, while the calls repeat exactly. This holds the part that needs no
Redis to the same count: a loopback session in stream mode applying an input entry (the
fencing check, the command's decoding, the conversation core) and encoding the audio delta it
answers with, in steady state. Only calls to the worker's, the store's and the contract's own
functions are counted (not the standard library's or a dependency's, which change with their
versions). A
change that adds calls per chunk fails here: raise the budget knowingly, or find the calls
elsewhere. The gateway's side: ``tests/gateway/test_hot_path_budget.py``.
"""

from __future__ import annotations

import logging
import time

import contract
import inference_worker
import store
from contract import messages as m
from inference_worker.backends.registry import loopback_core
from inference_worker.metrics import WorkerMetrics
from inference_worker.sessions import Session, SessionTable
from inference_worker.turn_detection.silero import detector_factory
from store.logs import InputEntry, WriteToken
from tests.call_count import calls_into

#: Calls into the worker's, the store's and the contract's code per streamed chunk, from the
#: input entry to the encoded output event.
CHUNK_BUDGET = 42

SESSION_ID = "sess_w1.0123456789abcdef"
TOKEN = WriteToken("epoch", 1)
STREAM = m.UpdateSession(session={"type": "realtime",
                                  "extra_body": {"loopback_mode": "stream"},
                                  "audio": {"input": {"turn_detection": None}}})
CHUNK = m.encode_message(m.AppendAudio(audio=bytes(960)))  # 20 ms of pcm16 at 24 kHz


def test_a_streamed_chunk_stays_within_its_budget() -> None:
    table = SessionTable(WorkerMetrics("loopback"), logging.getLogger(__name__),
                         mark_dirty=lambda session_id: None, engine=lambda: None)
    session = Session(core=loopback_core(SESSION_ID,
                                           detector=detector_factory("energy")))
    table.add(SESSION_ID, session)
    table.apply(SESSION_ID, session, [InputEntry(1, m.encode_message(STREAM), TOKEN)],
                time.monotonic())
    assert table.output_of(SESSION_ID, session) is not None  # session.updated
    session.unsent = []
    counts = []
    for index in range(2, 9):
        def relay(index: int = index) -> None:
            table.apply(SESSION_ID, session, [InputEntry(index, CHUNK, TOKEN)],
                        time.monotonic())
            assert table.output_of(SESSION_ID, session) is not None

        counts.append(calls_into((inference_worker, store, contract), relay))
        assert isinstance(m.decode_event(session.unsent[-1]), m.AudioDelta)  # the echo
        session.unsent = []  # as a write that landed leaves it
    # The first chunk of a turn also opens the response and its item; then steady state.
    assert 0 < max(counts[1:]) <= CHUNK_BUDGET, counts
