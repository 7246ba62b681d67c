#!/usr/bin/env bash
# `make run`: the hpcmem workflow on this machine with the embedded default profile
# (profiles/local) and the default sweep (config/config.yaml). Snakemake shows each job and
# "N of M steps done" as it goes; at the end the workflow prints where the report and the
# verdict are. Exit status: 0 ok, 1 a failed job or a regression found by `hpcmem check`.
# Extra arguments go to snakemake, e.g. `tools/run-workflow.sh --config run_id=try1` or `-n`.
set -euo pipefail
cd "$(dirname "$0")/.."
snakemake=.venv/bin/snakemake
if [[ ! -x $snakemake ]]; then
  echo "run-workflow: $snakemake not found: run \`make setup\` first" >&2
  exit 1
fi
export PATH="$PWD/.venv/bin:$PATH"
echo "hpcmem: running the workflow (profiles/local, config/config.yaml) on $(nproc) cores"
exec "$snakemake" --profile profiles/local --snakefile workflow/Snakefile --directory . "$@"
