#!/usr/bin/env bash
# GPU capacity check (issue 3, item 7): build a full-size Moshi (7.8B parameters, random
# weights) directly on the GPU in bf16 and report the largest batch whose p99 step time fits
# the 80 ms frame, eagerly and with CUDA graphs. One run stays under 8 minutes: the Python
# side budgets 450 s (--time-limit) and this wrapper kills it at 470 s regardless.
# Results: a table on stdout and bench-results/gpu_check.json (--output). Extra arguments go
# to `python -m duplex_gateway.gpu_check` (--help lists them). Exit status 2: no CUDA device, or
# a transformers older than the moshi extra pins (the streaming code needs >= 5.24).
# Needs only torch and transformers (not the serving stack): see GPU_CHECK_WHEELS below.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/python.sh
choose_python
# A GPU machine without network access: GPU_CHECK_WHEELS names a folder of wheels (say, the
# moshi extra's transformers) that are put in front of what the interpreter has.
use_wheels "${GPU_CHECK_WHEELS:-}"
exec timeout --signal=TERM --kill-after=5 470 "$python" -m duplex_gateway.gpu_check "$@"
