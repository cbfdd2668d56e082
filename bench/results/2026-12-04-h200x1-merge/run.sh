#!/usr/bin/env bash
# The GPU run of the merge of issues 35 (descriptor links), 32 (shim
# point-to-point), 31 (failed nonblocking starts) onto issue 36's renames.
# One device call from the repository root, carrying .gpubin (built by
# scripts/build-gpubin, plus prev/gpucoll-bench: the bench of 36e4077):
#   1. the gpu_check stages these changes touch (scripts/gpu-check, its
#      own MPS daemon), no bench;
#   2. scripts/gpu-check-shim, quick (carrying .gpubin-shim too);
#   3. A/B: all_reduce blocking, 8 B to 256 MiB, this commit's bench and
#      36e4077's alternated three times in separate jobs, 2 ranks under MPS.
# Usage: bash bench/results/2026-12-04-h200x1-merge/run.sh [phase...]
set -u
BIN=.gpubin
R=${OUT:-./out}
mkdir -p "$R"
export NCCL_NVLS_ENABLE=0
phases=${*:-check shim ab}
T0=$(date +%s)

if [[ " $phases " == *" check "* ]]; then
    OUT=$R/check GPU_CHECK_BENCH=0 GPU_CHECK_SIM2=0 GPU_CHECK_BUDGET=330 GPU_CHURN_CYCLES=300 \
        GPU_CHECK_STAGES="np2_p2p np1 raw_stream memkinds ce_memkinds ce_vmm np4_ce_vmm ce_register registered dead_peer" \
        bash scripts/gpu-check "$BIN" >"$R/check.txt" 2>&1
    echo "check: rc $? after $(($(date +%s) - T0)) s"
fi

if [[ " $phases " == *" shim "* ]]; then
    OUT=$R/shim SHIM_CHECK_QUICK=1 SHIM_CHECK_BUDGET=150 bash scripts/gpu-check-shim .gpubin-shim >"$R/shim.txt" 2>&1
    echo "shim: rc $? after $(($(date +%s) - T0)) s"
fi

if [[ " $phases " == *" ab "* ]]; then
    M=$(mktemp -d /tmp/ab-mps.XXXXXX)
    export CUDA_MPS_PIPE_DIRECTORY=$M/pipe CUDA_MPS_LOG_DIRECTORY=$M/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d
    ARGS=(--coll all_reduce --mode blocking -b 8 -e 256M -f 4 -n 50 -w 5 --time-budget 0.1 --min-iters 5)
    for round in 1 2 3; do
        for side in new prev; do
            b=$BIN/gpucoll-bench
            [ "$side" = prev ] && b=$BIN/prev/gpucoll-bench
            timeout 90 mpirun --allow-run-as-root --oversubscribe --bind-to none \
                -x NCCL_NVLS_ENABLE -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY \
                -n 2 "$b" "${ARGS[@]}" >"$R/ab_${side}_$round.txt" 2>&1
            echo "ab $side $round: rc $?"
        done
    done
    echo quit | nvidia-cuda-mps-control
    echo "ab: done after $(($(date +%s) - T0)) s"
fi
