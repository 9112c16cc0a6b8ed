#!/usr/bin/env bash
# GPU capacity check (issue 3, item 7): build a full-size Moshi (7.8B parameters, random
# weights) directly on the GPU in bf16 and report the largest batch whose p99 step time fits
# the 80 ms frame, eagerly and with CUDA graphs. One run stays under 8 minutes: the Python
# side budgets 450 s (--time-limit) and this wrapper kills it at 470 s regardless.
# Results: a table on stdout and bench-results/gpu_check.json (--output). Extra arguments go
# to `python -m duplex_gateway.gpu_check` (--help lists them). Exit status 2: no CUDA device, or
# a transformers older than the moshi extra pins (the streaming code needs >= 5.24).
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
exec timeout --signal=TERM --kill-after=5 470 "$python" -m duplex_gateway.gpu_check "$@"
