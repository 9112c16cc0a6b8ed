"""An event-loop error that is redis-py's, not ours: a cluster node dropped unclosed.

When a Cluster's topology changes (a failover, a resharding) redis-py's cluster client replaces
the nodes it knew and drops the old ones without closing them; each one's ``__del__`` then
reports "Unclosed ClusterNode object" to the loop's exception handler, which logs it as an
ERROR. Nothing is lost or leaked for long (its connections close when it is collected), so it
is logged as a warning; every other loop error goes on to the handler that was there.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["quiet_dropped_cluster_nodes"]

_log = logging.getLogger(__name__)
_DROPPED_NODE = "Unclosed ClusterNode object"


def quiet_dropped_cluster_nodes(loop: asyncio.AbstractEventLoop) -> None:
    """Log redis-py's dropped cluster nodes on ``loop`` as warnings, not errors."""
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == _DROPPED_NODE:
            _log.warning("redis-py dropped a replaced cluster node without closing it (%s): "
                         "its connections close when it is collected", context.get("client"))
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
