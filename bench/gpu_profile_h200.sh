#!/usr/bin/env bash
# Profile llama-3.1-8b (BF16, TP1) on one H200 and calibrate the step model from it: the one
# prepared script of issue 5 part 5 for a session that has the device machine. A few minutes:
# ~35 batch compositions x 5 repeats, then the fit.
#
# The device machine reaches no network. Its image's python3 (3.12) already holds torch, numba,
# numpy, pyyaml and rich; polars is not there and travels as wheels. Once, on the dev machine,
# from the repository root (the wheels are ~53 MB, inside the 64 MiB a call may carry):
#
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#       polars==2.1.0 polars-runtime-32==2.1.0
#
# then run it there with `.whl` carried:   bash bench/gpu_profile_h200.sh "$OUT"
# A dry run of the pipeline on any machine with torch (CPU, scaled-down shapes, no fit):
#   PYTHON=/path/to/python-with-torch DRY_RUN_CPU=1 bash bench/gpu_profile_h200.sh /tmp/dry
#
# Writes OUT_DIR/profile-llama-3.1-8b-h200.csv (measured kernel steps), the calibrated
# OUT_DIR/llama-3.1-8b-h200-sxm-141gb.yaml, nvidia-smi.txt, env.txt and calibrate.txt (the
# cross-validated error table). The steps hold GPU kernel time only, no engine CPU overhead:
# say so wherever the profile is shipped.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench/out}}"
py="${PYTHON:-python3}"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true

if ! "$py" -c "import polars" 2>/dev/null; then
    if ! ls .whl/polars*.whl > /dev/null 2>&1; then
        echo "polars is missing and no .whl/ to install it from (see this script's header)" >&2
        exit 2
    fi
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# The repository itself, not installed: nothing to fetch.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NUMBA_CACHE_DIR="${NUMBA_CACHE_DIR:-/tmp/llm-replay-numba}"

"$py" - > "$out/env.txt" <<'PY'
import platform, subprocess
import numba, numpy, polars, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("numba", numba.__version__, "numpy", numpy.__version__, "polars", polars.__version__)
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
PY
cat "$out/env.txt"

if [[ -n "${DRY_RUN_CPU:-}" ]]; then
    "$py" -m replay.cli profile --model llama-3.1-8b --gpu-name h200-sxm-141gb --tp 1 --device cpu --tiny \
        --repeats 1 --out "$out/profile-dry-run.csv"
    exit 0
fi
"$py" -m replay.cli profile --model llama-3.1-8b --gpu-name h200-sxm-141gb --tp 1 --device cuda \
    --repeats 5 --out "$out/profile-llama-3.1-8b-h200.csv"
"$py" -m replay.cli calibrate "$out/profile-llama-3.1-8b-h200.csv" --format generic \
    --model llama-3.1-8b --gpu h200-sxm-141gb --tp 1 --out "$out/llama-3.1-8b-h200-sxm-141gb.yaml" \
    | tee "$out/calibrate.txt"
