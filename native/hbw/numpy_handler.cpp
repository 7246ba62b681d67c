// The PyDataMem_Handler callbacks forward to an Allocator (ctx). They never raise:
// NumPy turns a nullptr into MemoryError with the byte count.
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define NPY_TARGET_VERSION NPY_1_22_API_VERSION
#include "numpy_handler.hpp"

#include <numpy/arrayobject.h>

#include <cstdio>
#include <map>
#include <string>

namespace py = pybind11;

namespace hpcmem::hbw {
namespace {

constexpr std::size_t kAlignment = 64;

// NumPy asks for at least one byte, but a zero-size request must not become a failure.
std::size_t at_least_one(std::size_t bytes) noexcept { return bytes == 0 ? 1 : bytes; }

void* handler_malloc(void* ctx, std::size_t bytes) {
  return static_cast<Allocator*>(ctx)->allocate(at_least_one(bytes), kAlignment);
}

void* handler_calloc(void* ctx, std::size_t count, std::size_t size) {
  if (count == 0 || size == 0) count = size = 1;
  return static_cast<Allocator*>(ctx)->allocate_zeroed(count, size);
}

void* handler_realloc(void* ctx, void* p, std::size_t bytes) {
  return static_cast<Allocator*>(ctx)->reallocate(p, at_least_one(bytes));
}

void handler_free(void* ctx, void* p, std::size_t /*bytes*/) {
  static_cast<Allocator*>(ctx)->deallocate(p);
}

PyDataMem_Handler* make_handler(Allocator& kind) {
  auto* h = new PyDataMem_Handler{};  // never freed: arrays keep pointing at it
  std::snprintf(h->name, sizeof h->name, "hpcmem_%s_%s", backend().name().c_str(),
                kind.name().c_str());
  h->version = 1;
  h->allocator = {&kind, handler_malloc, handler_calloc, handler_realloc, handler_free};
  return h;
}

}  // namespace

void import_numpy() {
  if (_import_array() < 0) throw py::error_already_set();
}

py::capsule handler(Allocator& kind) {
  static auto* handlers = new std::map<const Allocator*, PyDataMem_Handler*>;
  auto& slot = (*handlers)[&kind];
  if (slot == nullptr) slot = make_handler(kind);
  return py::capsule(slot, "mem_handler");
}

py::object set_handler(py::object capsule) {
  PyObject* previous = PyDataMem_SetHandler(capsule.is_none() ? nullptr : capsule.ptr());
  if (previous == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(previous);
}

}  // namespace hpcmem::hbw
