"""The log formats and their setting: JSON lines with ids and tracebacks, the text line, and
LogSettings read like every other setting (flag over variable, one-line refusals)."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from uvicorn.config import LOGGING_CONFIG

from duplex_gateway.logs import JsonFormatter, LogSettings, TextFormatter, formatter_class
from gateway.logredact import DropQueryStrings, log_config
from runtime.config import SettingsError, from_env

SESSION = "sess_w0123456789ab.0123456789abcdef0123456789abcdef"
_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def logged(formatter: logging.Formatter, emit: Any) -> str:
    """What a logger with one handler using ``formatter`` writes when ``emit(logger)`` runs."""
    sink = io.StringIO()
    handler = logging.StreamHandler(sink)
    handler.setFormatter(formatter)
    logger = logging.Logger("duplex.test")  # not registered: no other handler sees it
    logger.addHandler(handler)
    emit(logger)
    return sink.getvalue()


def json_line(emit: Any) -> dict[str, Any]:
    """The one JSON object a record is written as."""
    text = logged(JsonFormatter(), emit)
    assert text.endswith("\n") and text.count("\n") == 1, text
    line = json.loads(text)
    assert isinstance(line, dict)
    return line


def test_a_json_line_has_the_time_level_logger_and_formatted_message() -> None:
    """A plain record is exactly ts (ISO 8601 UTC, milliseconds), level, logger, message."""
    line = json_line(lambda log: log.warning("%d slots for %s", 4, "w1"))
    assert set(line) == {"ts", "level", "logger", "message"}
    assert (line["level"], line["logger"], line["message"]) == (
        "WARNING", "duplex.test", "4 slots for w1")
    assert _TS.match(line["ts"]), line["ts"]


def test_the_json_time_is_the_record_time_in_utc() -> None:
    """``ts`` is the moment the record was made, in UTC, to the millisecond."""
    created = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC).timestamp()
    record = logging.makeLogRecord({"name": "x", "msg": "m", "levelname": "INFO",
                                    "created": created})
    assert json.loads(JsonFormatter().format(record))["ts"] == "2026-01-02T03:04:05.678Z"


def test_a_json_line_carries_the_session_and_worker_ids_it_was_given() -> None:
    """``extra`` session_id and worker_id become keys of their own; other extras do not."""
    line = json_line(lambda log: log.info("serving", extra={
        "session_id": SESSION, "worker_id": "w0123456789ab", "peer": "10.0.0.1"}))
    assert (line["session_id"], line["worker_id"]) == (SESSION, "w0123456789ab")
    assert "peer" not in line


def test_a_json_line_holds_the_traceback_under_exc() -> None:
    """A record with exc_info has the formatted traceback, the exception's text included."""
    def emit(log: logging.Logger) -> None:
        try:
            raise RuntimeError("slot 3 exploded")
        except RuntimeError:
            log.exception("step failed", extra={"session_id": SESSION})

    line = json_line(emit)
    assert line["message"] == "step failed" and line["level"] == "ERROR"
    assert line["exc"].startswith("Traceback (most recent call last):"), line["exc"]
    assert "RuntimeError: slot 3 exploded" in line["exc"]


def test_a_value_json_cannot_hold_is_written_as_its_text() -> None:
    """An id that is not a string (an object, bytes) is str()'d, not a crash of the handler."""
    class Odd:
        def __str__(self) -> str:
            return "odd-id"

    line = json_line(lambda log: log.info("x", extra={"session_id": Odd(),
                                                       "worker_id": b"w1"}))
    assert (line["session_id"], line["worker_id"]) == ("odd-id", "b'w1'")


def test_a_multiline_message_stays_one_json_line() -> None:
    """Newlines in a message are escaped: one record, one line, however it reads."""
    line = json_line(lambda log: log.error("first\nsecond"))
    assert line["message"] == "first\nsecond"


def test_the_text_line_names_a_session_its_message_does_not() -> None:
    """The text format appends `` session=<id>`` when the message lacks the id, only then."""
    bare = logged(TextFormatter(), lambda log: log.info("slot 2 failed",
                                                        extra={"session_id": SESSION}))
    named = logged(TextFormatter(), lambda log: log.info("session %s ended", SESSION,
                                                         extra={"session_id": SESSION}))
    plain = logged(TextFormatter(), lambda log: log.info("registered"))
    assert bare.rstrip("\n").endswith(f"INFO duplex.test: slot 2 failed session={SESSION}")
    assert named.rstrip("\n").endswith(f"session {SESSION} ended")
    assert named.count(SESSION) == 1
    assert plain.rstrip("\n").endswith("INFO duplex.test: registered")


def test_log_settings_default_to_text_at_info() -> None:
    """Without flags or variables a process logs text at info, as before the setting."""
    settings = from_env(LogSettings, {})
    assert (settings.log_level, settings.log_format) == ("info", "text")
    assert formatter_class(settings) is TextFormatter
    assert formatter_class(from_env(LogSettings, {"DUPLEX_GATEWAY_LOG_FORMAT": "json"})) \
        is JsonFormatter


def test_a_log_flag_beats_its_variable_even_a_bad_one() -> None:
    """--log-level / --log-format win over DUPLEX_GATEWAY_LOG_*, which is then not read."""
    env = {"DUPLEX_GATEWAY_LOG_LEVEL": "loud", "DUPLEX_GATEWAY_LOG_FORMAT": "xml"}
    settings = from_env(LogSettings, env, log_level="debug", log_format="json")
    assert (settings.log_level, settings.log_format) == ("debug", "json")
    env = {"DUPLEX_GATEWAY_LOG_LEVEL": "warning", "DUPLEX_GATEWAY_LOG_FORMAT": "json"}
    assert from_env(LogSettings, env, log_level=None, log_format=None) == LogSettings(
        log_level="warning", log_format="json")


@pytest.mark.parametrize(("variable", "value"), [("LOG_LEVEL", "loud"), ("LOG_LEVEL", "INFO"),
                                                 ("LOG_FORMAT", "xml")])
def test_a_bad_log_variable_is_refused_by_name(variable: str, value: str) -> None:
    """A bad value names its variable and the accepted values, in one line."""
    with pytest.raises(SettingsError) as refused:
        from_env(LogSettings, {f"DUPLEX_GATEWAY_{variable}": value})
    message = str(refused.value)
    assert message.startswith(f"DUPLEX_GATEWAY_{variable}={value}: expected one of ")
    assert "\n" not in message
    assert ("debug, info, warning, error" if variable == "LOG_LEVEL" else "text, json") in message


def test_a_bad_log_flag_is_refused_by_its_flag() -> None:
    """A bad flag value names the flag, not the variable."""
    with pytest.raises(SettingsError, match=r"^--log-format xml: expected one of text, json$"):
        from_env(LogSettings, {}, log_format="xml")


def test_uvicorn_lines_take_the_given_formatter_and_keep_the_query_filter() -> None:
    """log_config(formatter) writes uvicorn's access and error lines with that formatter; every
    handler keeps DropQueryStrings whichever formatter writes; None keeps uvicorn's own."""
    config = log_config(JsonFormatter)
    assert set(config["formatters"]) == set(LOGGING_CONFIG["formatters"])
    assert all(spec == {"()": JsonFormatter} for spec in config["formatters"].values())
    assert config["filters"] == {"drop_query": {"()": DropQueryStrings}}
    for own in (config, log_config()):
        assert all("drop_query" in handler["filters"] for handler in own["handlers"].values())
    assert log_config()["formatters"] == LOGGING_CONFIG["formatters"]


_STRAY_FAILURES = """
import threading
from duplex_gateway.logs import LogSettings, configure_logging
configure_logging(LogSettings(log_format="json"))

class Broken:
    def __del__(self):
        raise ValueError("raised in __del__")

Broken()  # dropped at once: its __del__ raises where nothing can catch it
thread = threading.Thread(target=lambda: 1 / 0, name="doomed")
thread.start()
thread.join()
exit_thread = threading.Thread(target=lambda: exit(3), name="quits")
exit_thread.start()
exit_thread.join()
"""


@pytest.mark.timeout(60)
def test_failures_python_would_print_past_the_log_are_log_lines() -> None:
    """An exception raised where nothing can catch it (a ``__del__``) and one that ends a
    thread are written as the process's ERROR lines (JSON here, like every other line), with
    their tracebacks; a thread that exits on purpose writes nothing."""
    done = subprocess.run([sys.executable, "-c", _STRAY_FAILURES], capture_output=True,
                          text=True, timeout=50, check=True)
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(line["level"], line["logger"]) for line in lines] == [
        ("ERROR", "duplex_gateway.stray")] * 2, done.stderr
    unraisable, thread = lines
    assert "Broken.__del__" in unraisable["message"], unraisable
    assert unraisable["exc"].endswith("ValueError: raised in __del__"), unraisable
    assert thread["message"] == "doomed ended on an exception"
    assert thread["exc"].endswith("ZeroDivisionError: division by zero"), thread
