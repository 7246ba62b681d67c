// hpcmem._timing: OSU's collective timing loop in C over the communicator and buffers that
// mpi4py holds (see hpcmem/collectives/native.py).
#include <mpi.h>
#include <mpi4py/mpi4py.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>

#include "timing_loop.hpp"

namespace py = pybind11;
using namespace hpcmem::timing;

namespace {

/// mpi4py's C API, imported at the first call (importing mpi4py.MPI may initialise MPI).
void require_mpi4py() {
  static bool imported = false;
  if (!imported) {
    if (import_mpi4py() < 0) throw py::error_already_set();
    imported = true;
  }
}

template <typename Handle>
Handle handle(Handle* pointer) {
  if (pointer == nullptr) throw py::error_already_set();  // mpi4py set a TypeError
  return *pointer;
}

/// The bytes behind `array` (None: no buffer on this rank), kept alive in `held`.
void* address(const py::object& array, bool writable, std::optional<py::buffer_info>& held) {
  if (array.is_none()) return nullptr;
  held = array.cast<py::buffer>().request(writable);
  if (held->size > 0 && held->strides.back() != held->itemsize) {
    throw std::invalid_argument("buffer of " + std::to_string(held->size * held->itemsize) +
                                " bytes is not contiguous");
  }
  return held->ptr;
}

double rank_latency_of(const py::object& comm, const std::string& op, const py::object& send,
                       const py::object& recv, int count, const py::object& datatype,
                       const py::object& reduction, int root, std::vector<int> recv_counts,
                       int iterations, int warmup, bool separate) {
  require_mpi4py();
  std::optional<py::buffer_info> send_info, recv_info;
  Call call{collective(op),
            handle(PyMPIComm_Get(comm.ptr())),
            address(send, false, send_info),
            address(recv, true, recv_info),
            count,
            handle(PyMPIDatatype_Get(datatype.ptr())),
            handle(PyMPIOp_Get(reduction.ptr())),
            root,
            std::move(recv_counts)};
  py::gil_scoped_release unlocked;
  return rank_latency(call, iterations, warmup, separate);
}

}  // namespace

PYBIND11_MODULE(_timing, m) {
  m.doc() = "OSU's collective timing loop in C over mpi4py's communicator and buffers";
  int version = 0, subversion = 0;
  MPI_Get_version(&version, &subversion);
  m.attr("MPI_VERSION") = py::str(std::to_string(version) + "." + std::to_string(subversion));
  m.def("rank_latency", &rank_latency_of, py::arg("comm"), py::arg("op"), py::arg("send"),
        py::arg("recv"), py::arg("count"), py::arg("datatype"), py::arg("reduction"),
        py::arg("root"), py::arg("recv_counts"), py::arg("iterations"), py::arg("warmup"),
        py::arg("separate"),
        "This rank's mean seconds per call of `op` over `iterations` after `warmup` untimed "
        "ones, timed as OSU does (MPI_Wtime around each call; with `separate`, a barrier "
        "after each, outside the timed region).");
}
