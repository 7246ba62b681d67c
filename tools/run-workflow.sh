#!/usr/bin/env bash
# `make run`: the hpcmem workflow on this machine with the embedded default profile
# (profiles/local) and the default sweep (config/config.yaml), as a new run named by the
# current UTC time, so every call measures afresh and adds one run to the history that
# `hpcmem check` compares with. Snakemake shows each job and "N of M steps done"; at the end
# the workflow prints a short verdict summary (counts, failing and noisy figures) and where
# the report and the full verdict table are.
# Exit status: 0 no regression (noisy figures allowed), 1 a regression found by `hpcmem
# check`, 2 the sweep could not run (a failed job, bad configuration or config file,
# interrupted).
# Extra arguments go to snakemake: `-n` (dry run), or `--config run_id=ID` to resume run ID.
set -uo pipefail
cd "$(dirname "$0")/.."
snakemake=.venv/bin/snakemake
if [[ ! -x $snakemake ]]; then
  echo "run-workflow: $snakemake not found: run \`make setup\` first" >&2
  exit 2
fi
export PATH="$PWD/.venv/bin:$PATH"
# the config files snakemake reads before the workflow can check them: one line, exit 2
.venv/bin/python -m hpcmem.workflow.config profiles/local -- "$@" || exit 2
run_id=$(date -u +%Y%m%dT%H%M%SZ)
echo "hpcmem: workflow run $run_id (profiles/local, config/config.yaml) on $(nproc) cores"
echo "hpcmem: resume it if interrupted: tools/run-workflow.sh --config run_id=$run_id"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
"$snakemake" --profile profiles/local --snakefile workflow/Snakefile --directory . \
  --config "run_id=$run_id" "$@" 2>&1 | tee "$log" || status=${PIPESTATUS[0]}
# the check's own exit status (0 or 1), written by the workflow's check_regressions step
verdict=$(grep -E '^hpcmem: verdict ' "$log" | tail -1 | sed -E 's/^hpcmem: verdict (.*) \(every figure\)$/\1/')
check_status=""
if [[ -n $verdict ]]; then
  check_status=$(cat "$(dirname "$verdict")/exit_status" 2>/dev/null)
fi
if [[ $check_status == 1 ]]; then
  exit 1
fi
if ((status != 0)); then
  echo "hpcmem: COULD NOT RUN: snakemake exit $status (see the log above)" >&2
  exit 2
fi
exit 0
