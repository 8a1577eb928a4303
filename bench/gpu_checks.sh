#!/usr/bin/env bash
# Every GPU check of dflash_core in one call (a lent GPU is scarce: one command, then give it
# back): the gpu-marked tests, the multi-rank (TP2, NCCL) graph test, then the engine benchmark
# on both model layouts. Each step has
# its own time limit and writes its log and JSON under $OUT (default ./gpu_out), so a step
# that fails or runs out of time still leaves the others' results.
#
#   OUT=gpu_out bash bench/gpu_checks.sh      # at most 12.3 minutes (the step limits), one H200
#
# The limits leave room over what one H200 took (docs/BENCHMARKS.md): 28, 6, 212, about 145
# (the by-batch step's first version) and 116 s, about 8.5 minutes in all.
#
# Needs torch, safetensors and tokenizers (dflash_core's own dependencies) and pytest.
set -u
out=${OUT:-gpu_out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the repo's packages, installed or not
python=${PYTHON:-python3}

step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s)"
    local began=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$out/$name.log"
    echo "=== $name: exit $rc after $((SECONDS - began)) s"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1
"$python" bench/harness.py >>"$out/gpu.txt" 2>&1  # the host line every benchmark prints
cat "$out/gpu.txt"
step pytest_gpu 75 "$python" -m pytest -q -p no:cacheprovider -m gpu tests/dflash_core_tests \
    --ignore tests/dflash_core_tests/test_parallel_graphs.py
# Two ranks (NCCL), one GPU each (skipped on one GPU: NCCL refuses two ranks on one device):
# CUDA graphs capture the round with its collectives and replay it to the single-device tokens.
step pytest_gpu_parallel 50 "$python" -m pytest -q -p no:cacheprovider -m gpu \
    tests/dflash_core_tests/test_parallel_graphs.py
step bench_qwen3_8b 280 "$python" bench/engine_bench.py --shapes qwen3-8b --device cuda \
    --nodes 1,8,16,64,256 --json "$out/qwen3_8b.json"
# Does DFlash's gain fall as the batch grows? Plain vs DFlash b16, graphs, 1-64 requests.
step bench_by_batch 150 "$python" bench/engine_bench.py --shapes qwen3-8b --device cuda \
    --parts by-batch --e2e-batches 1,4,16,64 --e2e-context 1024 --json "$out/by_batch.json"
step bench_qwen3_30b_a3b 180 "$python" bench/engine_bench.py --shapes qwen3-30b-a3b \
    --contexts 4096 --batches 1,4 --nodes 1,16 --budgets 16,64 \
    --device cuda --json "$out/qwen3_30b_a3b.json"
