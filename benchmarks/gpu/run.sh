#!/usr/bin/env bash
# Build the Unified Memory library and the host Adam kernel, run the GPU tests, then the training benchmarks, on a GPU node.
#
#   benchmarks/gpu/run.sh [tests|bench|all]      (default: all)
#
# tests: build + `pytest -m gpu` (tests/test_integrations_gpu.py runs the examples/ too).
# bench: build + the benchmark groups in HPCMEM_BENCH_GROUPS (default: all of them, in order):
#   primitives  copy and prefetch rates, CPU AdamW, recompute-or-offload per block (primitives.json)
#   budget      0.35B transformer (bf16, 16 x 1024 tokens): cuda, FSDP2 + CPUOffloadPolicy with
#               and without save_on_cpu, and hpcmem with gpu_budget = 100, 50, 40, 25, 20 and 10%
#               of the footprint (2.5x, 5x, 10x and the budget curve), interleaved
#   budget-1.3B the same for the 1.3B transformer at 2 x 1024 tokens (budget curve)
#   0.35B 1.3B  transformers without a budget: cuda, um, hpcmem
#   cnn         ResNet-50 without a budget (fp32, batch 256, CPU-written batches): cuda, um, hpcmem
#   pinned      ResNet-50 bf16, batch 128, pinned batches (as DataLoader(pin_memory=True)):
#               cuda, hpcmem, then the jobs hpcmem, um, hpcmem, cuda, hpcmem in one process
#   hf-offload  (asked for by name) Hugging Face models (HPCMEM_HF_MODELS, gpt2-large; one after the
#               other, each with all its variants; random weights, 8 x 1024 tokens,
#               bf16, AdamW), one process per variant, interleaved (HPCMEM_HF_REPEATS, 1): cuda,
#               DeepSpeed ZeRO-2 + offload_optimizer cpu + HF checkpointing, hpcmem at the budget
#               ZeRO-Offload reserved (hf.jsonl, hf.md). DeepSpeed is installed for it from the
#               source distribution HPCMEM_DEEPSPEED_SDIST (its pure-Python needs in .whl/), its CPU
#               Adam compiled once, beside the build, before any variant runs;
#               HPCMEM_HF_BATCHES (default 8; "8 32": both) sequences per micro-batch;
#               HPCMEM_HF_ACCUMULATE (default 1; "1 8": both) micro-batches per optimizer step;
#               HPCMEM_HF_VARIANTS (default "cuda deepspeed hpcmem") the variants, in order, from
#               cuda, deepspeed, deepspeed3 (ZeRO-3 + offload_param and offload_optimizer cpu),
#               fsdp2 (FSDP2 + CPUOffloadPolicy), zenflow (DeepSpeed ZenFlow: ZeRO-2 + offload_optimizer
#               cpu + zenflow as its tutorial sets it), torchao (torchao's CPUOffloadOptimizer over fused
#               CPU AdamW; torchao's wheel in .whl/), megatrain (MegaTrain's CPUMasterModel and
#               DeepSpeed's CPU Adam; its sources unpacked from HPCMEM_MEGATRAIN_TARBALL, default
#               .dist/megatrain.tar.gz, its commit from the .commit file beside it; nothing of it
#               compiles) and hpcmem; NAME-nockpt runs NAME with
#               --no-checkpointing (e.g. "deepspeed-nockpt"); hpcmem@NAME runs hpcmem at the
#               bytes the variant NAME (run before it) reserved (e.g. "fsdp2 hpcmem@fsdp2
#               deepspeed-nockpt hpcmem@deepspeed-nockpt"), hpcmem@NAME*F at the share F of
#               them (e.g. "cuda hpcmem@cuda*0.3"), hpcmem@NGiB at a budget of N GiB (e.g.
#               "hpcmem+bf16state@12GiB"); hpcmem+delayed and hpcmem+bf16state
#               (either before an @) add --delayed-update and --state-dtype bfloat16
#               (e.g. "deepspeed hpcmem@deepspeed hpcmem+bf16state@deepspeed");
#               zenflow+ptcoresF runs ZenFlow with pt_reserved_cores_perc F (last in the
#               token; e.g. "zenflow zenflow+ptcores0.25": both, each a point of its own);
#               HPCMEM_HF_POINT_SECONDS (240) caps each variant's process;
#               HPCMEM_HF_STEPS and HPCMEM_HF_WARMUP
#               (4, 4) the timed and warm-up steps (multiples of ZenFlow's update_interval, 4, put
#               its whole update cycles into the records' mean step; the warm-up covers hpcmem's
#               plan, made after its fourth step): "HPCMEM_HF_VARIANTS='cuda hpcmem'
#               HPCMEM_HF_STEPS=200 HPCMEM_HF_WARMUP=0" is the loss check (hf.md's last column)
#   hf-offload-dp  (asked for by name) the same variants data-parallel, one rank per GPU, each
#               point its own `torchrun --standalone --nproc-per-node N` (hf-dp.jsonl, hf-dp.md):
#               per model (HPCMEM_HF_MODELS, default "llama-3b qwen2-7b": two families, ~3B and
#               ~7B; llama-7b and qwen2-3b too), per GPU count (HPCMEM_DP_GPUS, default 1, every
#               GPU nvidia-smi -L lists, then the powers of two between: a call cut short has
#               both ends of the scaling), per HPCMEM_HF_ACCUMULATE (default "1 8"), the variants
#               interleaved (HPCMEM_HF_VARIANTS, default "deepspeed zenflow fsdp2
#               hpcmem@deepspeed,zenflow cuda": ZeRO-2 + offload_optimizer cpu with and without
#               ZenFlow, FSDP2 + CPUOffloadPolicy, hpcmem at the least of what ZeRO-Offload and
#               ZenFlow reserved per GPU, DDP last, where it fits; zenflow runs at 1 micro-batch
#               only), 8 x 1024 tokens per GPU per micro-batch, HPCMEM_HF_STEPS and
#               HPCMEM_HF_WARMUP (4, 4) steps. Each point is capped at HPCMEM_DP_POINT_SECONDS
#               (300) and by the benchmark part's end, so that its record (rank 0's, every rank
#               merged) is written; a point without one is named in bench.log. The one call
#               on a node of several GPUs (docs/gpu-budget.md#data-parallelism):
#                 HPCMEM_GIT_SHA=<commit> HPCMEM_DEEPSPEED_SDIST=.dist/deepspeed-0.19.8.tar.gz \
#                   HPCMEM_BENCH_GROUPS=hf-offload-dp HPCMEM_BENCH_SECONDS=420 benchmarks/gpu/run.sh bench
# HPCMEM_GPU_TESTS (tests/test_*.py) picks the test files, HPCMEM_TEST_SECONDS (300) caps them; HPCMEM_BENCH_SECONDS (480) the benchmark part; HPCMEM_BENCH_REPEATS (2) the repeats;
# HPCMEM_BUDGETS the budget fractions of the 0.35B group; HPCMEM_FSDP and HPCMEM_FSDP_1_3B the
# FSDP2 variants of the budget groups (plain, activations; empty: none).
# Output goes to $OUT (default benchmarks/results/gpu-<UTC date>): env.txt, pytest.log,
# bench.log (build output included), train.jsonl, summary.md, primitives.json,
# budget_curve.png. The oversubscription guard stays on: nothing here asks for more managed
# memory than the GPU has free.
# Every record names its commit: run it in a git checkout or, in a copy without .git (a GPU
# node's), pass the commit copied, HPCMEM_GIT_SHA=<git rev-parse HEAD of the checkout copied>.
# With neither it stops (exit 2) before building or running anything.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-all}
case "$MODE" in tests|bench|all) ;; *) echo "run.sh: mode '$MODE' is not one of tests, bench, all" >&2; exit 2 ;; esac
OUT=${OUT:-benchmarks/results/gpu-$(date -u +%Y%m%d)}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset HPCMEM_ALLOW_OVERSUBSCRIPTION
# every record names its commit: from the checkout, or passed in where the copy has no .git
export HPCMEM_GIT_SHA=${HPCMEM_GIT_SHA:-$(git rev-parse --verify -q HEAD 2>/dev/null)}
[[ -n $HPCMEM_GIT_SHA ]] ||
  { echo "run.sh: no commit known: run it in a git checkout or set HPCMEM_GIT_SHA" >&2; exit 2; }
TMP_DIR=${TMPDIR:-/tmp}
# the logs name no folder of this machine: the checkout's paths relative to it, the temporary
# and the home folder as <tmp> and ~ (as benchmarks/provenance.py's shown does for records)
relative() { sed -u -e "s|$PWD/||g" -e "s|$TMP_DIR/|<tmp>/|g" -e "s|$HOME/|~/|g"; }
# Python packages the GPU image lacks, carried as wheels in .whl/: spython and jsonschema at
# least (the test plugins import them; without them pytest stops before any test).
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$TMP_DIR/hpcmem-site" .whl/*.whl &&
    export PYTHONPATH=$PYTHONPATH:$TMP_DIR/hpcmem-site
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command: benchmarks/gpu/run.sh $MODE (HPCMEM_BENCH_GROUPS=${HPCMEM_BENCH_GROUPS:-all})"
  echo "git: $HPCMEM_GIT_SHA"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  "$PY" -c 'import torch, sys; print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nproc | sed 's/^/cpus /'
  nvcc --version | tail -1
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

GROUPS_WANTED=" ${HPCMEM_BENCH_GROUPS:-primitives budget budget-1.3B pinned cnn 0.35B 1.3B} "
want() { [[ $GROUPS_WANTED == *" $1 "* ]]; }
: >"$OUT/bench.log"
ds_compile=
if [[ $MODE != tests ]] && { want hf-offload || want hf-offload-dp; } &&
   [[ -n ${HPCMEM_DEEPSPEED_SDIST:-} ]]; then
  # benchmark only, never a dependency of hpcmem; its CPU Adam (ZeRO-Offload's and ZenFlow's)
  # compiles beside hpcmem's build, so no variant's first run pays for it
  if DS_BUILD_OPS=0 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
       --target "$TMP_DIR/deepspeed-site" "$HPCMEM_DEEPSPEED_SDIST" >>"$OUT/bench.log" 2>&1; then
    export PYTHONPATH=$PYTHONPATH:$TMP_DIR/deepspeed-site
    "$PY" -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" \
      >"$OUT/deepspeed-ops.log" 2>&1 &
    ds_compile=$!
  else
    echo "DeepSpeed did not install (bench.log)"
  fi
fi

megatrain=${HPCMEM_MEGATRAIN_TARBALL:-.dist/megatrain.tar.gz}
if [[ $MODE != tests ]] && want hf-offload && [[ -f $megatrain ]]; then
  rm -rf "$TMP_DIR/megatrain" && mkdir -p "$TMP_DIR/megatrain" &&
    tar -xzf "$megatrain" -C "$TMP_DIR/megatrain" &&
    export HPCMEM_MEGATRAIN_DIR=$TMP_DIR/megatrain \
      HPCMEM_MEGATRAIN_COMMIT=$(cat "${megatrain%.tar.gz}.commit" 2>/dev/null)
fi

echo "== build (native/um, native/optim)" | tee -a "$OUT/bench.log"
start=$SECONDS
for part in um optim; do
  if ! { cmake -S "native/$part" -B "build/$part-gpu" -DCMAKE_BUILD_TYPE=Release \
           -DPython_EXECUTABLE="$(command -v "$PY")" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" &&
         cmake --build "build/$part-gpu" -j "$(nproc)" &&
         cmake --install "build/$part-gpu" --prefix hpcmem; } 2>&1 | relative >>"$OUT/bench.log"; then
    tail -20 "$OUT/bench.log"; echo "run.sh: build of native/$part failed (see $OUT/bench.log)" >&2; exit 1
  fi
done
echo "built in $((SECONDS - start)) s" | tee -a "$OUT/bench.log"
if [[ -n $ds_compile ]]; then
  wait "$ds_compile" && echo "DeepSpeed's CPU Adam compiled in $((SECONDS - start)) s" |
    tee -a "$OUT/bench.log" || echo "DeepSpeed's CPU Adam did not compile (deepspeed-ops.log)"
  relative <"$OUT/deepspeed-ops.log" >>"$OUT/bench.log"; rm -f "$OUT/deepspeed-ops.log"
fi

status=0
if [[ $MODE != bench ]]; then
  echo "== pytest -m gpu"
  mapfile -t gpu_tests < <(grep -l "pytest.mark.gpu" ${HPCMEM_GPU_TESTS:-tests/test_*.py})
  timeout "${HPCMEM_TEST_SECONDS:-300}" "$PY" -m pytest -q -m gpu -p no:cacheprovider -W ignore::UserWarning \
    "${gpu_tests[@]}" 2>&1 | relative >"$OUT/pytest.log" || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -15
  # the host's Adam kernel on this host's CPU (its AVX-512 version, where it has one)
  "$PY" -m pytest -q -p no:cacheprovider tests/test_um_adam_kernel.py 2>&1 | relative \
    >"$OUT/pytest-kernel.log" || status=1
  tail -1 "$OUT/pytest-kernel.log"
fi
[[ $MODE == tests ]] && exit $status

REPEATS=${HPCMEM_BENCH_REPEATS:-2}
DEADLINE=$((SECONDS + ${HPCMEM_BENCH_SECONDS:-480}))  # whole benchmark part, then the summary
bench() {  # bench SECONDS ARGS...: one model, all its variants, capped so the summary still runs
  local cap=$1; shift
  (( cap > DEADLINE - SECONDS - 10 )) && cap=$((DEADLINE - SECONDS - 10))
  (( cap > 20 )) || { echo "skipped (out of time): bench $*" | tee -a "$OUT/bench.log"; status=1; return; }
  timeout "$cap" "$PY" benchmarks/gpu/bench.py --out "$OUT/train.jsonl" "$@" 2>&1 | relative | tee -a "$OUT/bench.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || { echo "bench $* ended with status ${PIPESTATUS[0]}" | tee -a "$OUT/bench.log"; status=1; }
}

echo "== benchmarks: $GROUPS_WANTED"
if want primitives; then
  timeout 90 "$PY" benchmarks/gpu/primitives.py "$OUT/primitives.json" 2>&1 | relative >>"$OUT/bench.log" ||
    { echo "primitives failed (see bench.log)"; status=1; }
fi
TRANSFORMER=(--model transformer --seq-len 1024 --steps 4 --warmup 2 --budget-warmup 4)
want budget && bench 240 "${TRANSFORMER[@]}" --group budget --params 350000000 --batch 16 --repeats "$REPEATS" \
  --policies cuda --budgets "${HPCMEM_BUDGETS:-0.4,0.2,0.1,1,0.5,0.25}" \
  --fsdp "${HPCMEM_FSDP:-plain,activations}"
want budget-1.3B && bench 200 "${TRANSFORMER[@]}" --group budget --params 1300000000 --batch 2 --repeats 1 \
  --policies cuda --budgets 1,0.5,0.25,0.1 --fsdp "${HPCMEM_FSDP_1_3B:-plain,activations}"
if want pinned; then
  bench 80 --model cnn --batch 128 --dtype bf16 --steps 8 --warmup 2 --repeats "$REPEATS" --pinned-inputs \
    --policies cuda,hpcmem --group pinned
  bench 80 --model cnn --batch 128 --dtype bf16 --steps 8 --warmup 2 --repeats 1 --pinned-inputs \
    --policies hpcmem,um,hpcmem,cuda,hpcmem --group sequence
fi

want 0.35B && bench 80 "${TRANSFORMER[@]}" --params 350000000 --batch 16 --repeats 3
want 1.3B && bench 90 "${TRANSFORMER[@]}" --params 1300000000 --batch 8 --repeats 3
want cnn && bench 80 --model cnn --batch 256 --dtype fp32 --steps 8 --warmup 2 --repeats 3
hf_args() {  # hf_args TOKEN: the variant (hf_variant) and options (hf_extra) a token names
  local base=${1%%@*} from
  hf_variant=${base%%+*}; hf_variant=${hf_variant%-nockpt}; hf_extra=()
  [[ ${base%%+*} == *-nockpt ]] && hf_extra=(--no-checkpointing)
  [[ $base == *+delayed* ]] && hf_extra+=(--delayed-update)
  [[ $base == *+bf16state* ]] && hf_extra+=(--state-dtype bfloat16)
  [[ $base == *+ptcores* ]] && hf_extra+=(--zenflow-pt-cores "${base##*+ptcores}")
  if [[ $1 == hpcmem*@*GiB ]]; then
    from=${1#*@}; hf_extra+=(--budget-gib "${from%GiB}")
  elif [[ $1 == hpcmem*@* ]]; then
    from=${1#*@}; hf_extra+=(--budget-from "${from%%\**}")
    [[ $from == *\** ]] && hf_extra+=(--budget-scale "${from#*\*}")
  elif [[ $hf_variant == hpcmem ]]; then hf_extra+=(--budget-from deepspeed --budget-gib 9.6); fi
}
if want hf-offload; then
  for repeat in $(seq 1 "${HPCMEM_HF_REPEATS:-1}"); do
    for model in ${HPCMEM_HF_MODELS:-gpt2-large}; do
      for batch in ${HPCMEM_HF_BATCHES:-8}; do
      for accumulate in ${HPCMEM_HF_ACCUMULATE:-1}; do
        for token in ${HPCMEM_HF_VARIANTS:-cuda deepspeed hpcmem}; do
          cap=$(( DEADLINE - SECONDS - 10 ))
          (( cap > ${HPCMEM_HF_POINT_SECONDS:-240} )) && cap=${HPCMEM_HF_POINT_SECONDS:-240}
          (( cap > 20 )) || { echo "skipped (out of time): hf $model $token" | tee -a "$OUT/bench.log"; status=1; continue; }
          hf_args "$token"
          timeout "$cap" "$PY" benchmarks/gpu/hf_offload.py --variant "$hf_variant" --repeat "$repeat" \
            --model "$model" --batch "$batch" --accumulate "$accumulate" \
            --steps "${HPCMEM_HF_STEPS:-4}" --warmup "${HPCMEM_HF_WARMUP:-4}" \
            --out "$OUT/hf.jsonl" "${hf_extra[@]}" 2>&1 |
            relative | tee -a "$OUT/bench.log" | grep -v -E "^\s|Warning|warn" | tail -3
        done
      done
      done
    done
  done
  [[ -s $OUT/hf.jsonl ]] && "$PY" benchmarks/gpu/hf_table.py "$OUT/hf.jsonl" | tee "$OUT/hf.md"
fi
lines() { if [[ -f $1 ]]; then wc -l <"$1"; else echo 0; fi; }  # records in a file
if want hf-offload-dp; then
  all=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  counts=1; (( all > 1 )) && counts+=" $all"
  for ((n = 2; n < all; n *= 2)); do counts+=" $n"; done  # 1, all, then the powers of two between
  counts=${HPCMEM_DP_GPUS:-$counts}
  echo "data parallel: GPU counts $counts of $all" | tee -a "$OUT/bench.log"
  for repeat in $(seq 1 "${HPCMEM_HF_REPEATS:-1}"); do
    for model in ${HPCMEM_HF_MODELS:-llama-3b qwen2-7b}; do
      for gpus in $counts; do
        for accumulate in ${HPCMEM_HF_ACCUMULATE:-1 8}; do
          for token in ${HPCMEM_HF_VARIANTS:-deepspeed zenflow fsdp2 hpcmem@deepspeed,zenflow cuda}; do
            hf_args "$token"
            # DeepSpeed takes ZenFlow's accumulation from its update_interval (hf_offload.py)
            [[ $hf_variant == zenflow && $accumulate != 1 ]] && continue
            point="hf $model $token, $gpus GPUs, $accumulate micro-batches"
            cap=$(( DEADLINE - SECONDS - 10 )); (( cap > ${HPCMEM_DP_POINT_SECONDS:-300} )) && cap=${HPCMEM_DP_POINT_SECONDS:-300}
            (( cap > 30 )) || { echo "skipped (out of time): $point" | tee -a "$OUT/bench.log"; status=1; continue; }
            before=$(lines "$OUT/hf-dp.jsonl")
            timeout --kill-after=15 "$cap" "$PY" -m torch.distributed.run --standalone \
              --nproc-per-node "$gpus" benchmarks/gpu/hf_offload.py --world-size "$gpus" \
              --variant "$hf_variant" --repeat "$repeat" --model "$model" --accumulate "$accumulate" \
              --steps "${HPCMEM_HF_STEPS:-4}" --warmup "${HPCMEM_HF_WARMUP:-4}" \
              --out "$OUT/hf-dp.jsonl" "${hf_extra[@]}" 2>&1 |
              relative | tee -a "$OUT/bench.log" | grep -E "^[a-z0-9.-]+ .* rep [0-9]+ " | tail -1
            ended=${PIPESTATUS[0]}
            (( $(lines "$OUT/hf-dp.jsonl") > before )) ||
              { echo "no record (ended with $ended, cap $cap s): $point" | tee -a "$OUT/bench.log"; status=1; }
          done
        done
      done
    done
  done
  [[ -s $OUT/hf-dp.jsonl ]] && "$PY" benchmarks/gpu/hf_table.py "$OUT/hf-dp.jsonl" | tee "$OUT/hf-dp.md"
fi
if [[ -s $OUT/train.jsonl ]]; then
  echo "== summary"
  "$PY" benchmarks/gpu/summarize.py "$OUT/train.jsonl" --plot "$OUT/budget_curve.png" | tee "$OUT/summary.md"
fi
exit $status
