"""Model backends behind the torch-free interface of ``inference_worker/backend.py``.

Each backend module imports its model libraries itself; nothing here imports them, so the
base worker install (loopback only) pulls no torch.
"""

from __future__ import annotations

__all__: list[str] = []
