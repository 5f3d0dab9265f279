#!/usr/bin/env bash
# Profile llama-3.1-8b (BF16, TP1) on one H200 and calibrate the step model from it: the one
# prepared script of issue 5 part 5 for a session that has a GPU machine. A few minutes:
# installing torch (CUDA build), ~35 batch compositions x 5 repeats, then the fit.
#
#   bash bench/gpu_profile_h200.sh [OUT_DIR]      (default: $OUT if set, else bench/out)
#
# Writes OUT_DIR/profile-llama-3.1-8b-h200.csv (measured kernel steps), the calibrated
# OUT_DIR/llama-3.1-8b-h200-sxm-141gb.yaml, nvidia-smi.txt, env.txt and calibrate.txt (the
# cross-validated error table). The steps hold GPU kernel time only, no engine CPU overhead:
# say so wherever the profile is shipped.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench/out}}"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
python3 -m venv .venv-gpu
# torch from PyPI's default index is a CUDA build on Linux x86_64.
.venv-gpu/bin/pip install -q -e '.[profile]'
.venv-gpu/bin/python - > "$out/env.txt" <<'PY'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
PY
cat "$out/env.txt"
.venv-gpu/bin/llm-replay profile --model llama-3.1-8b --gpu-name h200-sxm-141gb --tp 1 --device cuda \
    --repeats 5 --out "$out/profile-llama-3.1-8b-h200.csv"
.venv-gpu/bin/llm-replay calibrate "$out/profile-llama-3.1-8b-h200.csv" --format generic \
    --model llama-3.1-8b --gpu h200-sxm-141gb --tp 1 --out "$out/llama-3.1-8b-h200-sxm-141gb.yaml" \
    | tee "$out/calibrate.txt"
