// OSU's collective timing loop in C: one call timed alone with MPI_Wtime, a barrier after it.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace hpcmem::timing {

/// The collectives, spelled as hpcmem.collectives.OPS names them.
enum class Collective {
  bcast, gather, allreduce, reduce, allgather, alltoall, scatter, reduce_scatter, barrier
};

/// `name` as a Collective; std::invalid_argument listing the accepted names otherwise.
Collective collective(const std::string& name);

/// One prepared collective call: the same arguments mpi4py passes to MPI for it.
struct Call {
  Collective op;
  MPI_Comm comm;
  const void* send;  // nullptr where this rank sends nothing
  void* recv;        // nullptr where this rank receives nothing
  int count;         // elements per rank block (hpcmem's `count`)
  MPI_Datatype type;
  MPI_Op reduction;
  int root;
  std::vector<int> recv_counts;  // reduce_scatter: elements each rank receives
};

/// This rank's mean seconds per call over `iterations` after `warmup` untimed ones;
/// `separate` puts a barrier after every iteration (OSU's collective loop), outside the
/// timed region. Throws std::runtime_error with MPI's error string when a call fails.
double rank_latency(const Call& call, int iterations, int warmup, bool separate);

}  // namespace hpcmem::timing
