#include "timing_loop.hpp"

#include <iterator>
#include <stdexcept>

namespace hpcmem::timing {
namespace {

const char* const kNames[] = {"bcast",     "gather",   "allreduce", "reduce",
                              "allgather", "alltoall", "scatter",   "reduce_scatter",
                              "barrier"};

void check(int code, const Call& call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string("MPI ") + kNames[static_cast<int>(call.op)] +
                           " failed (" + std::to_string(call.count) +
                           " elements per block): " + std::string(text, length));
}

int invoke(const Call& c) {
  switch (c.op) {
    case Collective::bcast:
      return MPI_Bcast(c.send ? const_cast<void*>(c.send) : c.recv, c.count, c.type, c.root,
                       c.comm);
    case Collective::gather:
      return MPI_Gather(c.send, c.count, c.type, c.recv, c.count, c.type, c.root, c.comm);
    case Collective::allreduce:
      return MPI_Allreduce(c.send, c.recv, c.count, c.type, c.reduction, c.comm);
    case Collective::reduce:
      return MPI_Reduce(c.send, c.recv, c.count, c.type, c.reduction, c.root, c.comm);
    case Collective::allgather:
      return MPI_Allgather(c.send, c.count, c.type, c.recv, c.count, c.type, c.comm);
    case Collective::alltoall:
      return MPI_Alltoall(c.send, c.count, c.type, c.recv, c.count, c.type, c.comm);
    case Collective::scatter:
      return MPI_Scatter(c.send, c.count, c.type, c.recv, c.count, c.type, c.root, c.comm);
    case Collective::reduce_scatter:
      return MPI_Reduce_scatter(c.send, c.recv, c.recv_counts.data(), c.type, c.reduction,
                                c.comm);
    case Collective::barrier:
      return MPI_Barrier(c.comm);
  }
  return MPI_ERR_OTHER;
}

}  // namespace

Collective collective(const std::string& name) {
  for (int i = 0; i < static_cast<int>(std::size(kNames)); ++i) {
    if (name == kNames[i]) return static_cast<Collective>(i);
  }
  std::string accepted;
  for (const char* known : kNames) accepted += (accepted.empty() ? "" : ", ") + std::string(known);
  throw std::invalid_argument("collective '" + name + "' is not one of " + accepted);
}

double rank_latency(const Call& call, int iterations, int warmup, bool separate) {
  if (iterations < 1 || warmup < 0) {
    throw std::invalid_argument("iterations must be >= 1 and warmup >= 0, got " +
                                std::to_string(iterations) + " and " + std::to_string(warmup));
  }
  check(MPI_Barrier(call.comm), call);
  for (int i = 0; i < warmup; ++i) {
    check(invoke(call), call);
    if (separate) check(MPI_Barrier(call.comm), call);
  }
  double total = 0.0;
  for (int i = 0; i < iterations; ++i) {
    const double start = MPI_Wtime();
    const int code = invoke(call);
    total += MPI_Wtime() - start;
    check(code, call);
    if (separate) check(MPI_Barrier(call.comm), call);
  }
  return total / iterations;
}

}  // namespace hpcmem::timing
