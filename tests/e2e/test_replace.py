"""A resume replaces the session's old connection wherever it is, its own gateway included."""

from __future__ import annotations

import pytest
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient
from tests.e2e.helpers import STREAM_SESSION, chunk_index, collect_until, marked_chunk, next_event
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

#: How long the replaced connection may take to hear of the resume. Nothing else would ever
#: tell an idle connection (it writes nothing that a fenced script could refuse), so without
#: the lease notice this deadline runs out.
NOTICE_DEADLINE_S = 10.0


async def test_resume_through_the_same_gateway_replaces_the_idle_old_connection(
    stack: Stack,
) -> None:
    """A second connection to gateway A resumes a session whose first connection, on A too, is
    open and idle: the first gets session.replaced and close 1000, the second carries on."""
    gateway = stack.gateway()
    stack.worker()
    first = await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION)
    await collect_until(first, "session.updated", [])
    second = DuplexClient(gateway.ws_url)
    second.session_id, second.resume_token = first.session_id, first.resume_token
    second.last_seq = first.last_seq
    resumed = await second.resume()
    assert resumed.data["lease_generation"] == first.generation + 1

    replaced = await next_event(first, NOTICE_DEADLINE_S)
    assert replaced.type == "session.replaced"
    assert replaced.data["session_id"] == first.session_id
    with pytest.raises(ConnectionClosed) as closed:
        await next_event(first, NOTICE_DEADLINE_S)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000

    await second.append_audio(marked_chunk(0, 7))
    echo = await collect_until(second, "response.output_audio.delta", [])
    assert chunk_index(echo.audio) == 7
    await second.close()
    await collect_until(second, "session.closed", [])
    await first.aclose()
    await second.aclose()
