#!/usr/bin/env bash
# The nightly performance sweep, for scrontab (profiles/slurm/nightly.scrontab) or cron
# (profiles/slurm/nightly.cron): the workflow on the site profile under a dated run_id, its
# check comparing the run with the references and with earlier nightly runs only (the
# nightly keeps its own history, apart from ad-hoc runs). Snakemake's output goes to the
# run's log (RUN/logs/nightly.log, appended to by each attempt), whose path it prints first;
# the terminal gets at most about 40 lines, ending in the summary: the verdict (counts,
# failing and noisy figures), the push to a dashboard when one is set, where the log, the
# report and the full verdict table are, and the outcome. A night that could not run shows
# hpcmem's own lines from the log (what ended it) instead of the verdict.
#
#   HPCMEM_PROFILE=hpcmem-site tools/nightly.sh [SNAKEMAKE ARGS...]
#
# Exit status: 0 no regression (NOISY figures, outside a band but not told from noise, are
# listed and allowed), 1 a regression, 2 the sweep could not run
# (preflight problems, a failed or cancelled job, SIGTERM from a time limit or scancel):
# then the verdict says `could not run` and why, no job of the sweep is left queued and
# the working directory is not left locked, so the next night starts as usual; 4 no
# regression, but the push to the dashboard failed (the server's answer is printed).
# Pushing (hpcmem export --to, docs/slurm-site.md): HPCMEM_EXPORT_TO (the server's URL;
# unset: no push), HPCMEM_EXPORT_FORMAT (influx, gelf or httpjson; default influx),
# HPCMEM_EXPORT_DATABASE (InfluxDB 1.x), HPCMEM_EXPORT_ORG and HPCMEM_EXPORT_BUCKET
# (InfluxDB 2.x), HPCMEM_EXPORT_TOKEN (the token, read by hpcmem export).
# Environment: HPCMEM_PROFILE (the site profile, a folder, or a name looked up in
# ~/.config/snakemake, /etc/xdg/snakemake, then the current folder; default $SNAKEMAKE_PROFILE),
# HPCMEM_RUN_ID (default nightly-YYYYMMDD, UTC), HPCMEM_WORKDIR (default the checkout),
# HPCMEM_OUTPUT_DIR (default results: the config's output_dir), HPCMEM_NIGHTLY_HISTORY
# (default OUTPUT_DIR/nightly-history under the working directory). Each is checked before
# anything is made (hpcmem/nightly.py): the run id and both folders as the workflow's config
# accepts them (a name; relative paths inside the working directory), the profile's files
# and any --configfile among the arguments, that the folders can be written, and that no
# workflow runs this run id already. A refused one is one line naming it, exit 2.
# Rerunning a night that could not run: HPCMEM_RUN_ID=<its run id>, same profile and args.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN_ID="${HPCMEM_RUN_ID:-nightly-$(date -u +%Y%m%d)}"
PROFILE="${HPCMEM_PROFILE:-${SNAKEMAKE_PROFILE:-}}"
WORKDIR="${HPCMEM_WORKDIR:-$REPO}"
OUTPUT_DIR="${HPCMEM_OUTPUT_DIR:-results}"
HISTORY="${HPCMEM_NIGHTLY_HISTORY:-$OUTPUT_DIR/nightly-history}"
RUN="$WORKDIR/$OUTPUT_DIR/$RUN_ID"
LOG="$RUN/logs/nightly.log"
SNAKEMAKE="$REPO/.venv/bin/snakemake"
PYTHON="$REPO/.venv/bin/python"
# the sweep's jobs are named <prefix>_<uuid>: found again by name to cancel what is left
JOB_PREFIX="$(printf %s "hpcmem-$RUN_ID" | tr -c 'A-Za-z0-9_-' _ | cut -c1-50)"

if [[ ! -x "$SNAKEMAKE" ]]; then
  echo "nightly: $SNAKEMAKE not found: run \`make setup\` in $REPO first" >&2
  exit 2
fi
if [[ -z "$PROFILE" ]]; then
  echo "nightly: no site profile: set HPCMEM_PROFILE (or SNAKEMAKE_PROFILE) to the profile" \
    "copied from profiles/slurm (docs/slurm-site.md)" >&2
  exit 2
fi
# the profile's folder: a name is looked up in Snakemake's config folders before the
# current one (from $HOME, `hpcmem` would be the checkout itself)
PROFILE="$("$PYTHON" -m hpcmem.nightly check --run-id "$RUN_ID" --profile "$PROFILE" \
  --workdir "$WORKDIR" --output-dir "$OUTPUT_DIR" --history "$HISTORY" -- "$@")" || exit 2
# Run from scrontab, this script is itself a Slurm job: keep its allocation's variables
# away from the jobs the workflow submits (SLURM_CONF, which names the cluster, stays).
for variable in $(compgen -e | grep -E '^(SLURM|SBATCH|SRUN)_' | grep -v '^SLURM_CONF$'); do
  unset "$variable"
done
export PATH="$REPO/.venv/bin:$PATH"

# How to redo what did not finish; the workflow says it too when it ends the run itself.
export HPCMEM_RERUN_HINT="rerun the nightly with HPCMEM_RUN_ID=$RUN_ID (same profile and arguments)"

# The verdict of a night that produced none: `could not run` and why (JSON and text), and
# how to redo it; the verdict is named only when it was written.
could_not_run() {
  # what ended it, in hpcmem's and Snakemake's own one-line words
  grep -aE '^(hpcmem[ :]|Error in rule|Error:|[A-Za-z]*Error:)' "$LOG" 2>/dev/null | tail -n 20
  echo "nightly: log     $LOG"
  echo "nightly: COULD NOT RUN run $RUN_ID: $1" >&2
  echo "nightly: to redo what did not finish, $HPCMEM_RERUN_HINT" >&2
  if "$PYTHON" -m hpcmem.nightly could-not-run "$RUN/check" "$RUN_ID" "$1"; then
    echo "nightly: verdict $RUN/check/verdict.txt"
  fi
  exit 2
}

# Jobs of this sweep still queued or running (after Snakemake has gone).
leftover_jobs() {
  squeue -h --me -o '%i %j' 2>/dev/null | awk -v p="${JOB_PREFIX}_" 'index($2, p) == 1 {print $1}'
}

# A verdict `could not run` left by an earlier attempt at this run would look current.
if grep -qs '"verdict": "could not run"' "$RUN/check/verdict.json"; then
  rm -f "$RUN/check/verdict.json" "$RUN/check/verdict.txt"
fi

# Push the night's figures where HPCMEM_EXPORT_TO says; one line, what was pushed or what
# the server answered; the status of hpcmem export (4: the push failed).
push_figures() {
  local args=(--format "${HPCMEM_EXPORT_FORMAT:-influx}" --to "$HPCMEM_EXPORT_TO") said status
  [[ -n "${HPCMEM_EXPORT_DATABASE:-}" ]] && args+=(--database "$HPCMEM_EXPORT_DATABASE")
  [[ -n "${HPCMEM_EXPORT_ORG:-}" ]] && args+=(--org "$HPCMEM_EXPORT_ORG")
  [[ -n "${HPCMEM_EXPORT_BUCKET:-}" ]] && args+=(--bucket "$HPCMEM_EXPORT_BUCKET")
  said="$("$REPO/.venv/bin/hpcmem" export "$RUN/summary" --verdict "$RUN/check/verdict.json" \
    "${args[@]}" 2>&1)"
  status=$?
  said="$(tail -n 1 <<<"$said")"
  if ((status == 0)); then
    echo "nightly: ${said#hpcmem export: }"
  else
    echo "nightly: PUSH FAILED (exit $status): ${said#hpcmem export: error: }" >&2
  fi
  return "$status"
}

mkdir -p "$RUN/logs"
echo "nightly: run $RUN_ID with profile $PROFILE in $WORKDIR ($(date -u +%FT%TZ))"
echo "nightly: log     $LOG (snakemake's output)"
echo "# nightly: run $RUN_ID with profile $PROFILE in $WORKDIR ($(date -u +%FT%TZ))" >>"$LOG"
terminated=""
"$SNAKEMAKE" --profile "$PROFILE" --snakefile "$REPO/workflow/Snakefile" \
  --directory "$WORKDIR" --slurm-jobname-prefix "$JOB_PREFIX" \
  --config "run_id=$RUN_ID" "output_dir=$OUTPUT_DIR" "check={history: $HISTORY}" "$@" \
  >>"$LOG" 2>&1 &
snakemake_pid=$!
# SIGTERM (a time limit, scancel of the nightly) or Ctrl-C: Snakemake cancels the sweep's
# jobs and exits (the workflow treats SIGTERM like Ctrl-C; one signal is enough).
stop() {
  terminated="$1"
  kill -TERM "$snakemake_pid" 2>/dev/null
}
trap 'stop TERM' TERM
trap 'stop INT' INT
workflow_status=0
while kill -0 "$snakemake_pid" 2>/dev/null; do
  wait "$snakemake_pid"
  workflow_status=$?
done
trap - TERM INT

if [[ -n "$terminated" ]]; then
  for job in $(leftover_jobs); do scancel "$job" 2>/dev/null; done
  for _ in $(seq 30); do [[ -z "$(leftover_jobs)" ]] && break; sleep 1; done
  if ((workflow_status > 128)) && compgen -G "$WORKDIR/.snakemake/locks/*" >/dev/null; then
    "$SNAKEMAKE" --snakefile "$REPO/workflow/Snakefile" --directory "$WORKDIR" --unlock -q
  fi
  could_not_run "stopped by SIG$terminated during the sweep; its Slurm jobs were cancelled"
fi
status_file="$RUN/check/exit_status"
if [[ ! -s "$status_file" ]]; then
  could_not_run "the sweep failed (snakemake exit $workflow_status) before its check ran: see its log"
fi
verdict="$(cat "$status_file")"
if [[ "$verdict" == 0 && $workflow_status -ne 0 ]]; then
  could_not_run "the sweep failed (snakemake exit $workflow_status): see its log"
fi
"$PYTHON" -m hpcmem.nightly summary "$RUN/check/verdict.json"
push_status=0
if [[ -n "${HPCMEM_EXPORT_TO:-}" ]]; then
  push_figures || push_status=$?
fi
echo "nightly: log     $LOG"
echo "nightly: report  $RUN/report/report.html"
echo "nightly: verdict $RUN/check/verdict.txt"
if [[ "$verdict" != 0 ]]; then
  echo "nightly: REGRESSION in run $RUN_ID: see $RUN/check/verdict.txt" >&2
  exit 1
fi
if ((push_status != 0)); then
  echo "nightly: run $RUN_ID within tolerance, but its figures did not reach $HPCMEM_EXPORT_TO" >&2
  exit 4
fi
echo "nightly: run $RUN_ID within tolerance"
