#!/usr/bin/env bash
# Installs SGLang 0.5.23 and vLLM 0.33.0 without their GPU kernels in one venv, .venv-parsers:
# enough to import their argument parsers, resolve SGLang's ServerArgs and create vLLM's engine
# config on a CPU. The `parsers` tests (`pytest -m parsers`) check every command `best
# --emit-flags` can print with them. Idempotent: a venv installed with these very pins, whose
# engines import, is left as it is; one from other pins gets these.
#
# Why --no-deps: either engine's own requirements pull a CUDA torch, flashinfer, DeepGEMM and
# the nvidia-* libraries (several GB); parsing needs none of them. The light packages below are
# what their import chains reach, pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PARSERS_VENV:-.venv-parsers}
SGLANG=0.5.23
VLLM=0.33.0
LIGHT=(
    transformers==5.19.0 tokenizers==0.23.2 numpy==2.3.5 msgspec==0.23.0 pybase64==1.5.1
    pyzmq==27.3.0 pydantic==2.14.4 psutil==7.2.2 requests==2.34.2 tqdm==4.70.1 PyYAML==6.0.4
    orjson==3.13.0 triton==3.9.0 pillow==13.0.0 starlette==1.10.0 ipython==9.18.1
    aiohttp==3.14.5 gguf==0.19.0
    cbor2==6.3.0 openai-harmony==0.0.8 openai==3.57.0 cloudpickle==3.1.3 cachetools==8.0.2
    uvloop==0.23.0 py-cpuinfo==9.0.0 fastapi==0.136.3 prometheus_client==0.26.0
    partial-json-parser==0.2.1.1.post7 xgrammar==0.2.8 llguidance==1.7.6 uvicorn==0.55.0
    watchfiles==1.3.0 dill==0.4.1 apache-tvm-ffi==0.1.11 sentencepiece==0.2.1
    compressed-tensors==0.18.0 einops==0.8.2
)
probe='import sglang.srt.server_args, vllm.engine.arg_utils, vllm.entrypoints.cli.serve'
pins="sglang==$SGLANG vllm==$VLLM ${LIGHT[*]}"
if [[ -x "$VENV/bin/python" && "$(cat "$VENV/pins" 2>/dev/null)" == "$pins" ]] &&
    VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c "$probe" 2>/dev/null; then
    echo "SGLang and vLLM parsers already in $VENV" >&2
    exit 0
fi
pip_quiet() {
    # This machine's pip names local indexes some packages are not in; their warnings are noise.
    "$VENV/bin/pip" install -q --no-warn-conflicts "$@" 2>&1 |
        { grep -v 'is ignored: it is neither' || true; }
}
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
# torch first, the local CPU build: a resolver left to itself may fetch a multi-GB CUDA build.
pip_quiet torch==2.13.0
pip_quiet "${LIGHT[@]}"
pip_quiet --no-deps "sglang==$SGLANG" "vllm==$VLLM"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c "$probe" 2>/dev/null
echo "$pins" >"$VENV/pins"
echo "SGLang $SGLANG and vLLM $VLLM parsers in $VENV" >&2
