"""Write a tiny random Moshi + Mimi model directory for tests, benches and development.

Usage: ``python scripts/make_tiny_moshi.py OUT_DIR [--seed N] [--no-tokenizer]``

The directory is a plain ``save_pretrained`` checkpoint (``config.json``, ``model.safetensors``,
and a made-up word-level tokenizer unless ``--no-tokenizer``), so it loads through the worker's
own code: ``MoshiBackend.load(OUT_DIR, device="cpu", dtype="float32", max_slots=16)``.
Needs the model stack (torch, transformers); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys

from inference_worker.backends.moshi_tiny import write_tiny_moshi


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and write the model; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    parser.add_argument(
        "--no-tokenizer", action="store_true", help="omit the tokenizer (text renders as <id>)"
    )
    parser.add_argument(
        "--context", type=int, default=3000, help="temporal sliding window in frames"
    )
    args = parser.parse_args(argv)
    model = write_tiny_moshi(
        args.out_dir, seed=args.seed, tokenizer=not args.no_tokenizer, sliding_window=args.context
    )
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote a tiny Moshi ({params / 1e6:.2f}M parameters) to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
