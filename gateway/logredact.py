"""Keep secrets out of the gateway's logs.

A browser cannot set headers, so some clients put an API key in the URL's query string
(``?api_key=...``); the gateway refuses that (401), but uvicorn's access and websocket lines
print the full path with its query. Every handler of the gateway process therefore drops the
query string from the paths it logs: the path alone says which endpoint was hit, and nothing a
client puts in a URL reaches the log.

API keys, client secrets and resume tokens are never logged by the gateway's own code (it keeps
digests only); ``tests/e2e/test_log_secrets.py`` scans every process log of the suite for them.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from uvicorn.config import LOGGING_CONFIG

__all__ = ["DropQueryStrings", "drop_query", "log_config"]


def drop_query(text: str) -> str:
    """``/v1/realtime?api_key=x`` -> ``/v1/realtime``; anything not a path is left alone."""
    if text.startswith("/") and "?" in text:
        return text.partition("?")[0]
    return text


class DropQueryStrings(logging.Filter):
    """A handler filter that removes query strings from a record's path arguments and its
    message (uvicorn passes the path as an argument; others may format it in)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(drop_query(a) if isinstance(a, str) else a
                                for a in record.args)
        if isinstance(record.msg, str) and "?" in record.msg:
            record.msg = " ".join(drop_query(word) for word in record.msg.split(" "))
        return True


def log_config(formatter: type[logging.Formatter] | None = None) -> dict[str, Any]:
    """uvicorn's logging configuration with :class:`DropQueryStrings` on every handler.

    Args:
        formatter: what writes uvicorn's own lines (access, errors) too, so they match the
            process's other lines (a JSON log is JSON throughout); None: uvicorn's own
            formatters. The caller chooses it: this layer knows no log formats.
    """
    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"drop_query": {"()": DropQueryStrings}}
    if formatter is not None:
        config["formatters"] = {name: {"()": formatter} for name in config["formatters"]}
    for handler in config["handlers"].values():
        handler["filters"] = [*handler.get("filters", []), "drop_query"]
    return config
