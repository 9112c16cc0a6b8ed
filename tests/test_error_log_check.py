"""Normal operation logs nothing at ERROR: the suite's own check of that (tests/conftest.py).

An ERROR record logged in the test process, or an ERROR line written to a spawned process's
log, fails the test that was running, unless it is marked ``logs_errors``. The fixtures are
checked by running pytest itself on small test files, with the suite's conftest as a plugin.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import LOGS_ERRORS
from tests.e2e.stack import LOG_DIR_VARIABLE, LogWatch, is_error_line, log_dir

pytestmark = pytest.mark.timeout(60)

#: What each inner run loads: the suite's conftest, none of the plugins the suite turns off.
INNER_ARGS = ("-p", "tests.conftest", "-p", "no:valkey", "-p", "no:cacheprovider")

ERROR_LINES = [
    "2026-01-01 12:00:00,123 ERROR gateway.app: session s1 failed",
    "2026-01-01 12:00:00,123 CRITICAL inference_worker.worker: out of memory",
    "ERROR:    Exception in ASGI application",
    "Traceback (most recent call last):",
    '{"ts": "2026-01-01T12:00:00Z", "level": "ERROR", "logger": "gateway.app", "message": "x"}',
    '{"ts": "2026-01-01T12:00:00Z", "level": "critical", "logger": "a", "message": "x"}',
]
QUIET_LINES = [
    "2026-01-01 12:00:00,123 WARNING gateway.app: the client sent ERROR in a frame",
    "2026-01-01 12:00:00,123 INFO uvicorn.access: GET /readyz 503",
    'INFO:     127.0.0.1:5000 - "WebSocket /v1/realtime" 403',
    '{"ts": "2026-01-01T12:00:00Z", "level": "WARNING", "logger": "a", "message": "ERROR"}',
    '{"level": "ERROR"',
    "1234:M 01 Jan 2026 12:00:00.000 # WARNING overcommit_memory is set to 0",
]


@pytest.fixture
def inner(pytester: pytest.Pytester, request: pytest.FixtureRequest,
          monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester whose runs know the suite's markers; the log folder the inner run points
    the environment at is put back afterwards."""
    markers = "\n".join(f"    {line}" for line in request.config.getini("markers"))
    pytester.makeini(f"[pytest]\nasyncio_default_fixture_loop_scope = function\n"
                     f"markers =\n{markers}\n")
    monkeypatch.setenv(LOG_DIR_VARIABLE, str(log_dir()))
    return pytester


@pytest.mark.parametrize("line", ERROR_LINES)
def test_error_lines_are_recognised(line: str) -> None:
    """The product's text format, uvicorn's, a traceback and a JSON line at ERROR count."""
    assert is_error_line(line)


@pytest.mark.parametrize("line", QUIET_LINES)
def test_other_lines_are_not_errors(line: str) -> None:
    """Lower levels do not count, even when their message says ERROR; nor does a broken JSON
    line or Redis's own log."""
    assert not is_error_line(line)


def test_each_line_is_judged_once_and_only_when_complete(tmp_path: Path) -> None:
    """A line still being written waits for its newline; a line once reported is not
    reported again."""
    watch = LogWatch(tmp_path)
    log = tmp_path / "0000-worker.log"
    log.write_text("2026-01-01 12:00:00,123 ERROR inference_worker.worker: half")
    assert watch.new_error_lines() == []
    with log.open("a") as stream:
        stream.write(" a line\n2026-01-01 12:00:00,124 INFO x: fine\n")
    assert watch.new_error_lines() == [
        "0000-worker.log: 2026-01-01 12:00:00,123 ERROR inference_worker.worker: half a line"]
    assert watch.new_error_lines() == []


def test_a_traceback_is_reported_with_what_printed_it_and_its_exception(
        tmp_path: Path) -> None:
    """A traceback that no ERROR line announces (an unraisable exception, a WARNING with
    ``exc_info``) is reported with the line before it and down to its exception line: the
    report must say what failed, not only that something did."""
    watch = LogWatch(tmp_path)
    log = tmp_path / "0000-gateway.log"
    log.write_text("2026-01-01 12:00:00,123 INFO x: fine\n"
                   "Exception ignored in: <function Thing.__del__ at 0x7f>\n"
                   "Traceback (most recent call last):\n"
                   '  File "thing.py", line 3, in __del__\n'
                   "    raise ValueError(1)\n"
                   "ValueError: 1\n"
                   "2026-01-01 12:00:00,124 INFO x: after\n")
    assert watch.new_error_lines() == [
        "0000-gateway.log: Exception ignored in: <function Thing.__del__ at 0x7f>\n"
        "Traceback (most recent call last):\n"
        '  File "thing.py", line 3, in __del__\n'
        "    raise ValueError(1)\n"
        "ValueError: 1"]


@pytest.mark.logs_errors  # the inner tests' records reach this process's root logger too
def test_an_error_record_fails_the_test_unless_it_is_marked(inner: pytest.Pytester) -> None:
    """An ERROR record logged in the test process errors the test at teardown, naming the
    record; the marked test and a test logging a WARNING pass."""
    inner.makepyfile(f"""
        import logging
        import pytest

        def test_logs_an_error():
            logging.getLogger("inner").error("the model failed")

        @pytest.mark.{LOGS_ERRORS}
        def test_provokes_an_error():
            logging.getLogger("inner").error("the model failed")

        def test_logs_a_warning():
            logging.getLogger("inner").warning("slow")
    """)
    result = inner.runpytest(*INNER_ARGS)
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_logs_an_error*",
                                 "*ERROR inner: the model failed*"])


def test_a_process_error_line_fails_the_test_unless_it_is_marked(
        inner: pytest.Pytester) -> None:
    """An ERROR line a process writes to its log during a test errors that test at teardown,
    naming the file and the line; the marked test and a WARNING line pass."""
    inner.makepyfile(f"""
        import pytest
        from tests.e2e.stack import new_log_path

        def write(line):
            new_log_path("worker").write_text(line + "\\n")

        def test_a_process_logs_an_error():
            write("2026-01-01 12:00:00,000 ERROR inference_worker.worker: step failed")

        @pytest.mark.{LOGS_ERRORS}
        def test_a_process_is_made_to_log_an_error():
            write("2026-01-01 12:00:00,000 ERROR inference_worker.worker: step failed")

        def test_a_process_logs_a_warning():
            write("2026-01-01 12:00:00,000 WARNING gateway.app: slow")
    """)
    result = inner.runpytest(*INNER_ARGS)
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_a_process_logs_an_error*",
                                 "*-worker.log: * ERROR inference_worker.worker: step failed*"])


@pytest.mark.parametrize("marked", [False, True])
def test_a_line_written_after_a_modules_last_test_counts_at_its_end(
        inner: pytest.Pytester, marked: bool) -> None:
    """A module's shared process that writes a traceback after the last test's check (before
    the module's fixture stops it) errors the module's last test, unless the module is
    marked."""
    mark = f"pytestmark = pytest.mark.{LOGS_ERRORS}" if marked else ""
    inner.makepyfile(f"""
        import pytest
        from tests.e2e.stack import new_log_path
        {mark}

        @pytest.fixture(scope="module")
        def shared_process():
            log = new_log_path("gateway")
            yield
            log.write_text("Traceback (most recent call last):\\n")

        def test_first(shared_process):
            pass

        def test_last(shared_process):
            pass
    """)
    result = inner.runpytest(*INNER_ARGS)
    if marked:
        result.assert_outcomes(passed=2)
        return
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_last*", "*after its last test*",
                                 "*-gateway.log: Traceback (most recent call last):*"])
