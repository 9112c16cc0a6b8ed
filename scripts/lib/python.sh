# Sourced by the check scripts that may run on a machine without network (scripts/gpu_check.sh,
# scripts/relay_check.sh), from the checkout's root.

# choose_python: $python is $PYTHON if set, else the project's ./.venv, else python3.
choose_python() {
  python="${PYTHON:-}"
  if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
  fi
}

# use_wheels DIR installs the folder's wheels, nothing fetched and no dependency resolved, into
# a fresh folder and puts it first on PYTHONPATH, so they win over whatever $python has (DIR
# empty: none); then the checkout itself goes first, installed or not.
use_wheels() {
  local wheels="$1"
  if [ -n "$wheels" ]; then
    local site
    site="$(mktemp -d)"
    "$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$site" \
      "$wheels"/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
}
