#!/usr/bin/env bash
# The offload comparison docs/gpu-budget.md cites, as stages that each fit a ten-minute job
# on a one-GPU node; each runs benchmarks/gpu/run.sh with the settings below.
#
#   benchmarks/gpu/offload_stages.sh STAGE [ARGS]
#
#   tests               build, then the GPU tests and the host Adam kernel's
#   peers MODEL [BATCH] MODEL at BATCH (default 8) x 1024 tokens: ZeRO-Offload, ZenFlow at
#                       DeepSpeed's cores share and at pt_reserved_cores_perc 0.25, hpcmem
#                       (exact, then delayed) at the least the DeepSpeed variants reserved,
#                       torchao's CPUOffloadOptimizer, and cuda for the losses
#   lean MODEL BATCH    MODEL at BATCH x 1024 tokens: MegaTrain, hpcmem at what MegaTrain
#                       reserved, cuda for the losses
#   drift MODEL         200 steps from a fixed seed, no warm-up: cuda, ZenFlow (0.25),
#                       hpcmem delayed and exact at ZenFlow's reserved bytes; every step's loss
#   7b BUDGET_GIB       Llama 7B, 64 x 1024 tokens a step (8 micro-batches of 8 x 1024), bf16
#                       moments, within BUDGET_GIB (e.g. 24 or 12); the plan picks the strategy
#
# MODEL is a name of benchmarks/gpu/hf_models.py (e.g. qwen2-1.5b, gemma-2b, llama-0.9b). The
# records go to $OUT (default benchmarks/results/gpu-<UTC date>-<stage>[-<model>]); a copy
# without .git needs HPCMEM_GIT_SHA, as for run.sh. DeepSpeed comes from
# HPCMEM_DEEPSPEED_SDIST (default .dist/deepspeed-0.19.8.tar.gz), torchao's wheel from .whl/,
# MegaTrain from .dist/megatrain.tar.gz (run.sh names each). HPCMEM_BENCH_SECONDS (540) caps
# a stage's benchmark part.
set -uo pipefail
cd "$(dirname "$0")/../.."
usage() {
  echo "offload_stages.sh: '$*' is not a stage with its arguments; accepted:" >&2
  sed -n '5,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2
}
stage=${1:-}
case "$stage" in
  tests) (( $# == 1 )) || usage "$@"; point=tests ;;
  peers) (( $# == 2 || $# == 3 )) || usage "$@"; point=peers-$2${3:+-$3} ;;
  drift) (( $# == 2 )) || usage "$@"; point=drift-$2 ;;
  lean) (( $# == 3 )) || usage "$@"; point=lean-$2-$3 ;;
  7b) (( $# == 2 )) && [[ $2 =~ ^[0-9]+([.][0-9]+)?$ ]] || usage "$@"; point=7b-${2}gib ;;
  *) usage "$@" ;;
esac
export OUT=${OUT:-benchmarks/results/gpu-$(date -u +%Y%m%d)-$point}
export HPCMEM_DEEPSPEED_SDIST=${HPCMEM_DEEPSPEED_SDIST:-.dist/deepspeed-0.19.8.tar.gz}
export HPCMEM_BENCH_SECONDS=${HPCMEM_BENCH_SECONDS:-540} HPCMEM_BENCH_GROUPS=hf-offload
run() { exec benchmarks/gpu/run.sh "$@"; }
case "$stage" in
  tests) run tests ;;
  peers)
    HPCMEM_HF_MODELS=$2 HPCMEM_HF_BATCHES=${3:-8} HPCMEM_HF_VARIANTS="deepspeed zenflow
      zenflow+ptcores0.25 hpcmem@deepspeed,zenflow torchao hpcmem+delayed@deepspeed,zenflow
      cuda" run bench ;;
  lean)
    HPCMEM_HF_MODELS=$2 HPCMEM_HF_BATCHES=$3 HPCMEM_HF_VARIANTS="megatrain hpcmem@megatrain cuda" \
      run bench ;;
  drift)
    HPCMEM_HF_MODELS=$2 HPCMEM_HF_BATCHES=8 HPCMEM_HF_STEPS=200 HPCMEM_HF_WARMUP=0 \
      HPCMEM_HF_VARIANTS="cuda zenflow+ptcores0.25 hpcmem+delayed@zenflow hpcmem@zenflow" \
      run bench ;;
  7b)
    HPCMEM_HF_MODELS=llama-7b HPCMEM_HF_BATCHES=8 HPCMEM_HF_ACCUMULATE=8 HPCMEM_HF_STEPS=2 \
    HPCMEM_HF_WARMUP=4 HPCMEM_HF_POINT_SECONDS=$((HPCMEM_BENCH_SECONDS - 20)) \
    HPCMEM_HF_VARIANTS="hpcmem+bf16state@${2}GiB" run bench ;;
esac
