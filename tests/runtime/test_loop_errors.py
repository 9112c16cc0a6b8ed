"""redis-py's dropped cluster nodes are a warning; every other loop error stays an error."""

from __future__ import annotations

import asyncio
import logging

import pytest

from runtime.loop_errors import quiet_dropped_cluster_nodes


async def test_a_dropped_cluster_node_is_a_warning_and_other_errors_pass_on(
        caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context["message"]))
    try:
        quiet_dropped_cluster_nodes(loop)
        with caplog.at_level(logging.WARNING, logger="runtime.loop_errors"):
            loop.call_exception_handler({"message": "Unclosed ClusterNode object",
                                         "client": "node 127.0.0.1:7000"})
            loop.call_exception_handler({"message": "Task exception was never retrieved"})
    finally:
        loop.set_exception_handler(previous)
    assert seen == ["Task exception was never retrieved"]
    [record] = caplog.records
    assert record.levelno == logging.WARNING and "127.0.0.1:7000" in record.getMessage()
