# Sourced by the check scripts that run on a machine without network (scripts/gpu_check.sh,
# scripts/relay_check.sh). use_wheels DIR installs the folder's wheels, nothing fetched and no
# dependency resolved, into a fresh folder and puts it first on PYTHONPATH, so they win over
# whatever the interpreter has; then the checkout itself goes first, installed or not.
# Expects $python (the interpreter) and the checkout as the working directory.
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
