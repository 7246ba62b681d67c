#!/usr/bin/env bash
# The nightly performance sweep, for scrontab (profiles/slurm/nightly.scrontab) or cron
# (profiles/slurm/nightly.cron): the workflow on the Slurm profile under a dated run_id;
# its check step compares the run with config/references.yaml and the history, and appends
# the run to the history. Prints the verdict table.
#
#   tools/nightly.sh [SNAKEMAKE ARGS...]      e.g. --configfile /etc/hpcmem/site.yaml
#
# Exit status: 0 every figure within tolerance, 1 a regression, 2 the sweep itself failed
# (a job failed, the cluster or the configuration is broken: see the Snakemake log).
# Environment: HPCMEM_RUN_ID (default nightly-YYYYMMDD, UTC), HPCMEM_PROFILE (default
# profiles/slurm), HPCMEM_WORKDIR (default the checkout), HPCMEM_OUTPUT_DIR (default
# results: the config's output_dir).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN_ID="${HPCMEM_RUN_ID:-nightly-$(date -u +%Y%m%d)}"
PROFILE="${HPCMEM_PROFILE:-$REPO/profiles/slurm}"
WORKDIR="${HPCMEM_WORKDIR:-$REPO}"
RUN="$WORKDIR/${HPCMEM_OUTPUT_DIR:-results}/$RUN_ID"
SNAKEMAKE="$REPO/.venv/bin/snakemake"

if [[ ! -x "$SNAKEMAKE" ]]; then
  echo "nightly: $SNAKEMAKE not found: run \`make setup\` in $REPO first" >&2
  exit 2
fi
# Run from scrontab, this script is itself a Slurm job: keep its allocation's variables
# away from the jobs the workflow submits (SLURM_CONF, which names the cluster, stays).
for variable in $(compgen -e | grep -E '^(SLURM|SBATCH|SRUN)_' | grep -v '^SLURM_CONF$'); do
  unset "$variable"
done
export PATH="$REPO/.venv/bin:$PATH"

echo "nightly: run $RUN_ID with $PROFILE in $WORKDIR ($(date -u +%FT%TZ))"
"$SNAKEMAKE" --profile "$PROFILE" --snakefile "$REPO/workflow/Snakefile" \
  --directory "$WORKDIR" --config "run_id=$RUN_ID" "$@"
workflow_status=$?

status_file="$RUN/check/exit_status"
if [[ ! -s "$status_file" ]]; then
  echo "nightly: the sweep failed (snakemake exit $workflow_status) before its check ran" >&2
  exit 2
fi
verdict="$(cat "$status_file")"
if [[ "$verdict" == 0 && $workflow_status -ne 0 ]]; then
  echo "nightly: the sweep failed (snakemake exit $workflow_status)" >&2
  exit 2
fi
echo "nightly: report $RUN/report/report.html"
if [[ "$verdict" != 0 ]]; then
  echo "nightly: REGRESSION in run $RUN_ID: see $RUN/check/verdict.txt" >&2
  exit 1
fi
echo "nightly: run $RUN_ID within tolerance"
