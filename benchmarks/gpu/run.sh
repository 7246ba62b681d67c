#!/usr/bin/env bash
# Build the Unified Memory library, run the GPU tests, then the training benchmarks, on a GPU node.
#
#   benchmarks/gpu/run.sh [smoke|bench|all]      (default: all)
#
# smoke: build + `pytest -m gpu` + a tiny run of every benchmark variant (a few minutes).
# bench: build + the benchmarks: ResNet-50 (input-heavy, fp32, batch 256) and transformers of
#        about 0.35B, 1.3B and 5.3B parameters (bf16 autocast, AdamW), policies cuda/um/hpcmem,
#        3 repeats interleaved; a GPU-budget run (footprint 2.5x the budget) and FSDP2 CPU
#        offload on the 0.35B model, 2 repeats interleaved.
#        HPCMEM_BENCH_SECONDS (500) caps the benchmark part; HPCMEM_BENCH_MODELS picks groups
#        ("cnn 0.35B budget 1.3B 6B", the default: all).
# Output goes to $OUT (default benchmarks/results/gpu-<UTC date>): build.log, pytest.log,
# bench.log, train.jsonl (DESIGN.md records), summary.md, env.txt. The oversubscription guard
# stays on: nothing here asks for more managed memory than the GPU has free.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-all}
case "$MODE" in smoke|bench|all) ;; *) echo "run.sh: mode '$MODE' is not one of smoke, bench, all" >&2; exit 2 ;; esac
OUT=${OUT:-benchmarks/results/gpu-$(date -u +%Y%m%d)}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
unset HPCMEM_ALLOW_OVERSUBSCRIPTION
export HPCMEM_GIT_SHA=${HPCMEM_GIT_SHA:-$(git rev-parse --verify -q HEAD 2>/dev/null || echo unknown)}
# Python packages the GPU image lacks (e.g. jsonschema), carried as wheels in .whl/.
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/hpcmem-site .whl/*.whl &&
    export PYTHONPATH=$PYTHONPATH:/tmp/hpcmem-site
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command: benchmarks/gpu/run.sh $MODE"
  echo "git: $HPCMEM_GIT_SHA"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  "$PY" -c 'import torch, sys; print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -1
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

echo "== build (native/um)"
start=$SECONDS
if ! { cmake -S native/um -B build/um-gpu -DCMAKE_BUILD_TYPE=Release \
         -DPython_EXECUTABLE="$(command -v "$PY")" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" &&
       cmake --build build/um-gpu -j "$(nproc)" &&
       cmake --install build/um-gpu --prefix hpcmem; } >"$OUT/build.log" 2>&1; then
  tail -20 "$OUT/build.log"; echo "run.sh: build failed (see $OUT/build.log)" >&2; exit 1
fi
echo "built in $((SECONDS - start)) s"

status=0
if [[ $MODE != bench ]]; then
  echo "== pytest -m gpu"
  mapfile -t gpu_tests < <(grep -l "pytest.mark.gpu" tests/test_*.py)
  timeout 240 "$PY" -m pytest -q -m gpu -p no:cacheprovider "${gpu_tests[@]}" >"$OUT/pytest.log" 2>&1 || status=1
  tail -15 "$OUT/pytest.log"
fi

MODELS=" ${HPCMEM_BENCH_MODELS:-cnn 0.35B budget 1.3B 6B} "  # which benchmark groups to run
want() { [[ $MODELS == *" $1 "* ]]; }
DEADLINE=$((SECONDS + ${HPCMEM_BENCH_SECONDS:-500}))  # whole benchmark part, then the summary
bench() {  # bench SECONDS ARGS...: one model, all its variants, capped so the summary still runs
  local cap=$1; shift
  (( cap > DEADLINE - SECONDS - 10 )) && cap=$((DEADLINE - SECONDS - 10))
  (( cap > 20 )) || { echo "skipped (out of time): bench $*" | tee -a "$OUT/bench.log"; status=1; return; }
  timeout "$cap" "$PY" benchmarks/gpu/bench.py --out "$OUT/train.jsonl" "$@" 2>&1 | tee -a "$OUT/bench.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || { echo "bench $* ended with status ${PIPESTATUS[0]}" | tee -a "$OUT/bench.log"; status=1; }
}

if [[ $MODE == smoke ]]; then
  echo "== smoke benchmarks"
  bench 60 --model cnn --batch 32 --dtype fp32 --steps 2 --warmup 1 --repeats 1
  bench 90 --model transformer --params 125000000 --batch 4 --seq-len 512 --steps 2 --warmup 1 \
    --repeats 1 --budget-ratio 2.5 --fsdp
else
  echo "== benchmarks"
  want cnn && bench 80 --model cnn --batch 256 --dtype fp32 --steps 8 --warmup 2 --repeats 3
  want 0.35B && bench 80 --model transformer --params 350000000 --batch 16 --seq-len 1024 \
    --steps 8 --warmup 2 --repeats 3
  want budget && bench 130 --model transformer --params 350000000 --batch 16 --seq-len 1024 \
    --steps 4 --warmup 2 --repeats 2 --policies "" --budget-ratio 2.5 --fsdp
  want 1.3B && bench 90 --model transformer --params 1300000000 --batch 8 --seq-len 1024 \
    --steps 6 --warmup 2 --repeats 3
  # The largest: per-type pools keep params + AdamW's foreach temporaries (params pool) and the
  # activations + autocast weight copies (activations pool) apart, so the managed footprint is
  # the sum of both peaks: 5.89B at batch 1 needed 138.5 GB of a 141.5 GB guard limit (cuda:
  # 120 GB reserved) and later repeats were refused. 5.34B at batch 1 leaves a margin.
  want 6B && bench 150 --model transformer --params 5500000000 --batch 1 --seq-len 1024 \
    --steps 4 --warmup 2 --repeats 3
fi

if [[ -s $OUT/train.jsonl ]]; then
  echo "== summary"
  "$PY" benchmarks/gpu/summarize.py "$OUT/train.jsonl" | tee "$OUT/summary.md"
fi
exit $status
