"""Redis Sentinel: ``redis+sentinel://`` URLs, and the store carrying on through a failover."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from store import OutputAppend, Scripts, create_client
from store.client import SentinelTarget, parse_sentinel_url
from store.keys import SessionKeys
from store.logs import log_ends, read_input, read_output
from store.pubsub import Subscriber
from store.pushes import OutputPushed
from tests.sentinel_trio import Trio, start_trio
from tests.store._support import ev, open_session, register_worker


@pytest.mark.parametrize(("url", "target"), [
    ("redis+sentinel://127.0.0.1:26379/main",
     SentinelTarget(sentinels=(("127.0.0.1", 26379),), service="main")),
    ("redis+sentinel://:s%40cret@a:1,b:2,[::1]:3/main/4",
     SentinelTarget(sentinels=(("a", 1), ("b", 2), ("::1", 3)), service="main", db=4,
                    password="s@cret")),
])
def test_sentinel_urls(url: str, target: SentinelTarget) -> None:
    """Hosts, service, db and password are read from the URL."""
    assert parse_sentinel_url(url) == target


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0", "redis+sentinel:///main", "redis+sentinel://a:1/",
    "redis+sentinel://a/main", "redis+sentinel://a:1/main/x", "redis+sentinel://a:1/m/0/9",
])
def test_bad_sentinel_urls_are_refused(url: str) -> None:
    """Each malformed URL names what was expected."""
    with pytest.raises(ValueError):
        parse_sentinel_url(url)


@pytest.fixture(params=["redis", "valkey"])
def trio(request: pytest.FixtureRequest) -> Iterator[Trio]:
    """A fresh trio per test: a failover changes the topology for good."""
    running = start_trio(request.param)
    yield running
    running.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("own_connection", [False, True], ids=["redis-py", "own"])
async def test_sessions_carry_on_through_a_failover(trio: Trio, own_connection: bool) -> None:
    """Writes before and after a failover land in one log, numbered on; pushes resume."""
    client = create_client(trio.url)
    scripts = Scripts(client, own_connection=own_connection)
    subscriber = Subscriber(client)
    await subscriber.start()
    try:
        wid = await register_worker(scripts)
        opened = await open_session(scripts, wid)
        sid = opened.session_id
        pushed: list[Any] = []
        await subscriber.subscribe(SessionKeys(sid).output_channel, pushed.append)
        assert await scripts.append_output(sid, [ev(1), ev(2)], first_seq=1) == 1

        await asyncio.to_thread(trio.fail_over)

        # The first write after the promotion meets the demoted master (READONLY) or a closed
        # connection; either way it was not applied there, and it is sent again to the new one.
        (first,) = await scripts.append_output_many([OutputAppend(
            session_id=sid, events=[ev(3)], first_seq=3)])
        assert first == 3
        assert await read_output(client, sid, 0) == [(1, ev(1)), (2, ev(2)), (3, ev(3))]
        assert (await log_ends(client, sid)).last_output == 3
        deadline = asyncio.get_running_loop().time() + 10
        while not any(isinstance(n, OutputPushed) and n.first_seq >= 4 for n in pushed):
            await scripts.append_output(sid, [ev(len(pushed) + 100)], first_seq=0)
            assert asyncio.get_running_loop().time() < deadline, pushed
            await asyncio.sleep(0.05)  # pacing the probe writes; the push is the condition
    finally:
        await subscriber.aclose()
        await scripts.aclose()
        await client.aclose()


@pytest.mark.timeout(60)
async def test_plain_input_appends_carry_on_through_a_failover(trio: Trio) -> None:
    """A pulling worker's input goes as plain MULTIs: the first one after the promotion meets
    the demoted master (READONLY, nothing queued runs) or a closed connection, the script
    settles it on the new master, and the next ones are plain again there. Every command is
    in the log once, in order, packed entries read back command by command."""
    client = create_client(trio.url)
    scripts = Scripts(client, own_connection=True)
    try:
        wid = await register_worker(scripts, pulls=True)
        opened = await open_session(scripts, wid)
        await scripts.append_input(opened.lease, [(1, b"a"), (2, b"b")], max_entries=100)

        await asyncio.to_thread(trio.fail_over)

        for seq in range(3, 9, 2):
            taken = await scripts.append_input(
                opened.lease, [(seq, b"%d" % seq), (seq + 1, b"%d" % (seq + 1))],
                max_entries=100)
            assert (taken.appended, taken.last_index) == (2, seq + 1)
        assert await read_input(client, opened.session_id, 0) == [
            (1, b"a"), (2, b"b"), *((seq, b"%d" % seq) for seq in range(3, 9))]
    finally:
        await scripts.aclose()
        await client.aclose()
