#!/usr/bin/env bash
# `make run`: the hpcmem workflow on this machine with the embedded default profile
# (profiles/local) and the default sweep (config/config.yaml), as a new run named by the
# current UTC time, so every call measures afresh and adds one run to the history that
# `hpcmem check` compares with. Snakemake shows each job and "N of M steps done"; at the end
# the workflow prints where the report and the verdict are.
# Exit status: 0 ok, 1 a failed job or a regression found by `hpcmem check`.
# Extra arguments go to snakemake: `-n` (dry run), or `--config run_id=ID` to resume run ID.
set -euo pipefail
cd "$(dirname "$0")/.."
snakemake=.venv/bin/snakemake
if [[ ! -x $snakemake ]]; then
  echo "run-workflow: $snakemake not found: run \`make setup\` first" >&2
  exit 1
fi
export PATH="$PWD/.venv/bin:$PATH"
run_id=$(date -u +%Y%m%dT%H%M%SZ)
echo "hpcmem: workflow run $run_id (profiles/local, config/config.yaml) on $(nproc) cores"
echo "hpcmem: resume it if interrupted: tools/run-workflow.sh --config run_id=$run_id"
# the verdict table can be long: repeat where the report and the verdict are, last
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
"$snakemake" --profile profiles/local --snakefile workflow/Snakefile --directory . \
  --config "run_id=$run_id" "$@" 2>&1 | tee "$log" || status=${PIPESTATUS[0]}
grep -E '^hpcmem: (report|verdict) ' "$log" || true
exit "$status"
