"""Input backpressure through real processes: a client that outruns its worker is told
(``input_backpressure``, then close 1013), resumes, resends what was not taken, and loses,
duplicates and reorders nothing."""

from __future__ import annotations

import asyncio
import signal

import pytest

from duplex_client import DuplexClient, RealtimeEvent, Resumed
from tests.e2e.helpers import STREAM_SESSION, chunk_index, collect_until, marked_chunk
from tests.e2e.stack import Proc, Stack, http_answer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: The most unread commands a session may have (the gateway's INPUT_LOG_MAX_ENTRIES).
CAP = 16
CHUNKS = 4 * CAP
REFUSED_METRIC = "duplex_gateway_commands_refused_total"


def refused_total(gateway: Proc) -> float:
    """The gateway's count of refused commands, from its /metrics."""
    answer = http_answer(gateway.http_url + "/metrics")
    assert answer is not None and answer[0] == 200
    for line in answer[1].splitlines():
        if line.startswith(REFUSED_METRIC + " "):
            return float(line.split()[1])
    raise AssertionError(f"{REFUSED_METRIC} is not exported")


async def test_a_client_outrunning_a_stopped_worker_resumes_and_loses_nothing(
    stack: Stack,
) -> None:
    """The worker is SIGSTOPped while a stream-mode client appends 4 x CAP chunks: once CAP
    are unread, the gateway refuses the next batch with input_backpressure and closes 1013,
    taking nothing after it. After SIGCONT the client resumes by itself and resends from
    last_client_seq: every chunk is echoed exactly once, in order, and the gateway counted
    the refusal."""
    stack.env["DUPLEX_GATEWAY_INPUT_LOG_MAX_ENTRIES"] = str(CAP)
    stack.env["DUPLEX_GATEWAY_HEARTBEAT_TTL_S"] = "60"  # stopped, it is not declared lost
    gateway = stack.gateway()
    worker = stack.worker()
    client = await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION)
    await collect_until(client, "session.updated", [])

    worker.process.send_signal(signal.SIGSTOP)
    events: list[RealtimeEvent] = []
    try:
        for index in range(CHUNKS):
            await client.append_audio(marked_chunk(0, index))
        async with asyncio.timeout(30):
            async for event in client.events():
                events.append(event)
                if event.type == "error":
                    break
    finally:
        worker.process.send_signal(signal.SIGCONT)
    error = events[-1].data["error"]
    assert (error["code"], error["type"]) == ("input_backpressure", "rate_limit_error"), error
    assert refused_total(gateway) >= 1

    async with asyncio.timeout(30):
        async for event in client.events():
            events.append(event)
            if sum(e.type == "response.output_audio.delta" for e in events) == CHUNKS:
                break
    echoed = [chunk_index(e.audio) for e in events if e.type == "response.output_audio.delta"]
    assert echoed == list(range(CHUNKS)), "0 lost, 0 duplicated, 0 reordered"
    assert any(isinstance(e, Resumed) for e in events), "it resumed after the 1013"
    await client.close()
    await collect_until(client, "session.closed", events)
    await client.aclose()
    resumes = sum(isinstance(e, Resumed) for e in events)
    print(f"\n{CHUNKS} chunks against a stopped worker (cap {CAP}): refused and resumed"
          f" {resumes} time(s), every chunk echoed once, in order")
