"""One session's conversation, the same for every backend: the core and its state machines,
turn policies, the history and its items, playback ledgers, refusals, the session object's
rules, and the port through which the core drives its model and hears its reports.

I/O-free throughout, and nothing is imported here: each module is imported by its own name.
"""

from __future__ import annotations

__all__: list[str] = []
