#!/usr/bin/env bash
# Run gdn_replayssm.sm90_report with the Triton version the device machine has (3.6.0 on the H200), so that
# registers, spills and SASS match what the GPU runs; other Triton versions compile differently.
#     kernels/scripts/sm90_device_triton.sh [sm90_report arguments...]
# Builds a side virtual environment once (WARDEN_SM90_VENV, default .venv-sm90 in the repository root) that
# holds only that Triton and sees the project venv's packages (torch) through a .pth file.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
version=${WARDEN_DEVICE_TRITON:-3.6.0}
main="$root/.venv/bin/python"
side=${WARDEN_SM90_VENV:-$root/.venv-sm90}
[ -x "$main" ] || { echo "sm90_device_triton.sh: $main is missing; run ops/scripts/bootstrap first" >&2; exit 2; }
if ! "$side/bin/python" -c "import triton, sys; sys.exit(triton.__version__ != '$version')" 2>/dev/null; then
    "$main" -m venv "$side"
    "$side/bin/python" -m pip install -q --no-deps "triton==$version"
    shared=$("$main" -c "import site; print(site.getsitepackages()[0])")
    mine=$("$side/bin/python" -c "import site; print(site.getsitepackages()[0])")
    echo "$shared" >"$mine/zz_project_venv.pth"  # after the side venv's own packages: its Triton wins
fi
cd "$root"
PYTHONPATH=kernels exec "$side/bin/python" -m gdn_replayssm.sm90_report "$@"
