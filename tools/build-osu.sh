#!/usr/bin/env bash
# Build and install the OSU Micro-Benchmarks from a source tarball, outside the package:
#   tools/build-osu.sh TARBALL PREFIX
# (about 2 minutes on 2 cores; PREFIX/libexec/osu-micro-benchmarks/mpi/collective/ then holds
# osu_allreduce and the rest). Idempotent: an existing PREFIX with osu_allreduce returns at once.
set -euo pipefail
tarball=$1
prefix=$(realpath -m "$2")
[[ -x "$prefix/libexec/osu-micro-benchmarks/mpi/collective/osu_allreduce" ]] && exit 0
[[ -f "$tarball" ]] || { echo "build-osu.sh: no tarball at '$tarball'" >&2; exit 2; }
source_dir=$(mktemp -d)
trap 'rm -rf "$source_dir"' EXIT
tar -xzf "$tarball" -C "$source_dir" --strip-components=1
echo "hpcmem: building OSU Micro-Benchmarks into $prefix (log: $prefix.log)"
mkdir -p "$(dirname "$prefix")"
(cd "$source_dir" && ./configure CC=mpicc CXX=mpicxx --prefix="$prefix" &&
  make -j"$(nproc)" && make install) >"$prefix.log" 2>&1 ||
  { tail -20 "$prefix.log" >&2; echo "build-osu.sh: build failed (see $prefix.log)" >&2; exit 1; }
