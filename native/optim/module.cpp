// hpcmem._optim: the host optimizer's native Adam/AdamW step over flat buffers, on a pool of
// bound threads (see hpcmem/um/host_optimizer/kernel.py, which checks every buffer first).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "adam.hpp"
#include "pool.hpp"

namespace py = pybind11;
using namespace hpcmem::optim;

namespace {

/// Elements each thread's part starts at a multiple of: 64 bytes of fp32, one cache line.
constexpr std::size_t ALIGN = 16;

Dtype dtype_of(const std::string& name) {
  if (name == "float32") return Dtype::float32;
  if (name == "bfloat16") return Dtype::bfloat16;
  throw std::invalid_argument("dtype '" + name + "' is not float32 or bfloat16");
}

template <typename T>
T* pointer(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

void adam_step(Pool& pool, const std::string& isa, std::size_t count, std::uintptr_t master,
               std::uintptr_t exp_avg, std::uintptr_t exp_avg_sq,
               const std::string& state_dtype, std::uintptr_t grad,
               const std::string& grad_dtype, std::uintptr_t out, const std::string& out_dtype,
               float beta2, float one_minus_beta1, float one_minus_beta2, float eps,
               float step_size, float bias_correction2_sqrt, float decay_factor, float l2,
               float sign, bool decoupled, std::uint32_t seed) {
  const AdamStep step{beta2, one_minus_beta1, one_minus_beta2, eps, step_size,
                      bias_correction2_sqrt, decay_factor, l2, sign, decoupled, seed};
  const AdamTensors tensors{pointer<float>(master),    pointer<void>(exp_avg),
                            pointer<void>(exp_avg_sq), dtype_of(state_dtype),
                            pointer<const void>(grad), dtype_of(grad_dtype),
                            pointer<void>(out),        dtype_of(out_dtype)};
  adam_range(isa, step, tensors, 0, 0);  // an unknown instruction set fails here, not in a thread
  py::gil_scoped_release unlocked;
  pool.run(count, ALIGN, [&](std::size_t begin, std::size_t end) {
    adam_range(isa, step, tensors, begin, end);
  });
}

}  // namespace

PYBIND11_MODULE(_optim, m) {
  m.doc() = "The host optimizer's native Adam/AdamW step (hpcmem.um.host_optimizer.kernel).";
  m.def("instruction_sets", &instruction_sets,
        "Instruction sets this CPU runs the kernel with, best first.");
  py::class_<Pool>(m, "Pool", "Threads bound one per CPU (-1: unbound).")
      .def(py::init<const std::vector<int>&>(), py::arg("cpus"))
      .def_property_readonly("size", &Pool::size);
  m.def("adam_step", &adam_step, py::arg("pool"), py::arg("isa"), py::arg("count"),
        py::arg("master"), py::arg("exp_avg"), py::arg("exp_avg_sq"), py::arg("state_dtype"),
        py::arg("grad"),
        py::arg("grad_dtype"), py::arg("out"), py::arg("out_dtype"), py::arg("beta2"),
        py::arg("one_minus_beta1"), py::arg("one_minus_beta2"), py::arg("eps"),
        py::arg("step_size"), py::arg("bias_correction2_sqrt"), py::arg("decay_factor"),
        py::arg("l2"), py::arg("sign"), py::arg("decoupled"), py::arg("seed"),
        "One Adam step over `count` elements at the given addresses (unchecked: the caller "
        "checks them), on `pool`.");
}
