"""``python -m duplex_gateway``: the same as the ``duplex-gateway`` command."""

from __future__ import annotations

from duplex_gateway.cli import main

if __name__ == "__main__":
    main()
