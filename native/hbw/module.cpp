// hpcmem._hbw: Python bindings of the placement backends, NEP-49 handlers and placement.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <system_error>

#include "allocator.hpp"
#include "numpy_handler.hpp"
#include "placement.hpp"

namespace py = pybind11;
using namespace hpcmem::hbw;

PYBIND11_MODULE(_hbw, m) {
  m.doc() = "UMF or memkind buffers, NEP-49 NumPy handlers and page placement (see hpcmem.hbw)";
  import_numpy();

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const AllocationError& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::logic_error& e) {  // configure() twice, or not at all
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const std::system_error& e) {
      py::object error = py::reinterpret_borrow<py::object>(PyExc_OSError)(
          e.code().value(), e.what());
      PyErr_SetObject(PyExc_OSError, error.ptr());
    }
  });

  m.attr("KINDS") = py::tuple(py::cast(kind_names()));
  m.attr("BACKENDS") = py::tuple(py::cast(backend_names()));
  m.def(
      "configure",
      [](const std::string& name, std::vector<unsigned> hbw, std::vector<unsigned> local_hbw,
         std::vector<unsigned> dax_kmem) {
        configure(name, Nodes{std::move(hbw), std::move(local_hbw), std::move(dax_kmem)});
      },
      py::arg("backend"), py::arg("hbw"), py::arg("local_hbw"), py::arg("dax_kmem"),
      "Make `backend` (one of BACKENDS) serve every kind, bound to these nodes; once per process.");
  m.def(
      "backend", [] { return py::make_tuple(backend().name(), backend().version()); },
      "The configured backend's name and version, e.g. ('umf', '1.2.0').");
  m.def(
      "highest_bandwidth_nodes", [] { return backend().highest_bandwidth_nodes(); },
      "The nodes the backend ranks highest in bandwidth (UMF's HIGHEST_BANDWIDTH memspace), "
      "or None when it has no view.");
  m.def(
      "check_available", [](const std::string& kind) { return allocator(kind).check_available(); },
      py::arg("kind"), "0 when `kind` can allocate on this machine, else the backend's error code.");

  py::class_<Buffer>(m, "Buffer", py::buffer_protocol(),
                     "Bytes of one kind, freed by that kind when the last reference dies.")
      .def(py::init([](const std::string& kind, std::size_t nbytes, bool zero) {
             return new Buffer(allocator(kind), nbytes, zero);
           }),
           py::arg("kind"), py::arg("nbytes"), py::arg("zero") = false,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("kind", [](const Buffer& b) { return b.kind().name(); })
      .def_property_readonly("nbytes", &Buffer::size)
      .def_property_readonly("address",
                             [](const Buffer& b) { return reinterpret_cast<std::uintptr_t>(b.data()); })
      .def_buffer([](Buffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<unsigned char>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {1}, false);
      });

  m.def(
      "handler", [](const std::string& kind) { return handler(allocator(kind)); }, py::arg("kind"),
      "The NEP-49 handler capsule ('mem_handler') of `kind`.");
  m.def("set_handler", &set_handler, py::arg("capsule"),
        "Install a 'mem_handler' capsule (None: NumPy's default); returns the previous one.");
  m.def("page_size", &page_size, "The system page size in bytes.");
  m.def("page_nodes", &page_nodes, py::arg("address"), py::arg("nbytes"),
        py::call_guard<py::gil_scoped_release>(),
        "Pages of the range per NUMA node (negative keys: -errno of pages not placed).");
  m.def("page_policies", &page_policies, py::arg("address"), py::arg("nbytes"),
        "Pages of the range per memory policy, spelled as in /proc/self/numa_maps.");
  m.def(
      "verify_hbw",
      [](std::uintptr_t address, std::size_t nbytes) {
        return backend().verify_hbw(reinterpret_cast<void*>(address), nbytes);
      },
      py::arg("address"), py::arg("nbytes"),
      "The backend's own check: 0 when every page is on an HBW node, -1 when not, else errno.");
}
