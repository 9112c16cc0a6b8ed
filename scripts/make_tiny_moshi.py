#!/usr/bin/env python3
"""Write a tiny random Moshi + Mimi model directory for tests, benches and development.

Usage: ``scripts/make-tiny-moshi OUT_DIR [--seed N] [--no-tokenizer]`` (the wrapper runs this
file with the project's ``.venv``), or ``PYTHON scripts/make_tiny_moshi.py OUT_DIR`` with any
interpreter that has torch and transformers: the checkout is put on its path, installed or not.

The directory is a plain ``save_pretrained`` checkpoint (``config.json``, ``model.safetensors``,
and a made-up word-level tokenizer unless ``--no-tokenizer``), so it loads through the worker's
own code: ``MoshiBackend.load(OUT_DIR, device="cpu", dtype="float32", max_slots=16)``.
Needs the model stack (torch, transformers); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run as a file, the interpreter puts scripts/ on the path, not the checkout that holds the
# project's packages: put it first, so this checkout is what runs, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and write the model; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    parser.add_argument(
        "--no-tokenizer", action="store_true", help="omit the tokenizer (text renders as <id>)"
    )
    parser.add_argument(
        "--context", type=int, default=3000,
        help="temporal sliding window in frames (default 3000)"
    )
    args = parser.parse_args(argv)
    try:  # after the arguments: --help works without the model stack
        from inference_worker.backends.moshi_tiny import write_tiny_moshi
    except ImportError as exc:
        print(f"make_tiny_moshi: needs torch and transformers, the project's [moshi] extra "
              f"({exc}); {sys.executable} lacks them", file=sys.stderr)
        return 2
    model = write_tiny_moshi(
        args.out_dir, seed=args.seed, tokenizer=not args.no_tokenizer, sliding_window=args.context
    )
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote a tiny Moshi ({params / 1e6:.2f}M parameters) to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
