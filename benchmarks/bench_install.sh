#!/usr/bin/env bash
# Installing zhpipe into a fresh virtual environment two ways, side by side: the README's path for a machine
# without a GPU (the CPU build of PyTorch first, then zhpipe) and a plain `pip install` (which takes PyTorch's
# default build, CUDA on Linux x86_64). Prints wall time, the environment's size, the torch build and how many
# nvidia-* packages came with it.
#
#   benchmarks/bench_install.sh [SOURCE]                      # SOURCE: a checkout or wheel (default: this checkout)
#   TORCH_CPU='torch==2.13.0' benchmarks/bench_install.sh     # where the CPU build comes from elsewhere
#   ONLY=cpu benchmarks/bench_install.sh                      # one of the two (cpu|plain)
set -euo pipefail
SOURCE=${1:-$(cd "$(dirname "$0")/.." && pwd)}
PYTHON=${PYTHON:-python3}
TORCH_CPU=${TORCH_CPU:-"torch --index-url https://download.pytorch.org/whl/cpu"}
WORK=$(mktemp -d /tmp/zhpipe-install-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

measure() {  # name, then the install commands (run in the fresh environment, one per argument)
    local name=$1; shift
    local venv="$WORK/$name"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
    local start=$SECONDS
    for step in "$@"; do
        # shellcheck disable=SC2086 - each step is a pip argument list
        "$venv/bin/pip" install --quiet --no-cache-dir $step
    done
    local took=$((SECONDS - start))
    local size build nvidia
    size=$(du -sm "$venv" | cut -f1)
    build=$("$venv/bin/python" -c 'import torch; print(torch.__version__, "cuda" if torch.version.cuda else "cpu")')
    nvidia=$("$venv/bin/pip" list 2>/dev/null | grep -c '^nvidia-' || true)
    printf '| %s | %d:%02d | %s MB | %s | %s |\n' "$name" $((took / 60)) $((took % 60)) "$size" "$build" "$nvidia"
    rm -rf "$venv"
}

echo "| install | wall | environment | torch | nvidia-* packages |"
echo "|---|---|---|---|---|"
[ "${ONLY:-cpu}" = cpu ] && measure cpu "$TORCH_CPU" "$SOURCE"
[ "${ONLY:-plain}" = plain ] && measure plain "$SOURCE"
exit 0
