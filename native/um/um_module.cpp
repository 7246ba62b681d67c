// hpcmem._um: Python bindings of libhpcmem_um (policies, counters, range advice and queries).
#include <dlfcn.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "hpcmem_um.h"

namespace py = pybind11;

namespace {

void check(int rc) {
  if (rc != 0) throw std::runtime_error(hpcmem_um_last_error());
}

hpcmem_um_policy make_policy(int preferred, int accessed_by, bool read_mostly, bool prefetch) {
  return hpcmem_um_policy{preferred, accessed_by, read_mostly ? 1 : 0, prefetch ? 1 : 0};
}

void* as_stream(std::uintptr_t stream) { return reinterpret_cast<void*>(stream); }

std::string library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&hpcmem_um_malloc_params), &info) == 0 || !info.dli_fname) {
    throw std::runtime_error("hpcmem-um: cannot locate libhpcmem_um (dladdr failed)");
  }
  return info.dli_fname;
}

py::dict counters(int type) {
  hpcmem_um_counters c{};
  check(hpcmem_um_counters_get(type, &c));
  py::dict d;
  d["live_bytes"] = c.live_bytes;
  d["peak_bytes"] = c.peak_bytes;
  d["segments"] = c.segments;
  d["gpu_bytes"] = c.gpu_bytes;
  d["advice_calls"] = c.advice_calls;
  d["prefetched_bytes"] = c.prefetched_bytes;
  d["refusals"] = c.refusals;
  d["last_refused_bytes"] = c.last_refused_bytes;
  return d;
}

py::dict range_attributes(std::uintptr_t ptr, size_t size) {
  hpcmem_um_range_attributes a{};
  check(hpcmem_um_range_attributes_get(ptr, size, &a));
  std::vector<int> accessed_by;
  for (int id : a.accessed_by) {
    if (id != HPCMEM_UM_INVALID_ID) accessed_by.push_back(id);
  }
  py::dict d;
  d["preferred_location"] = a.preferred_location;
  d["last_prefetch_location"] = a.last_prefetch_location;
  d["read_mostly"] = a.read_mostly != 0;
  d["accessed_by"] = accessed_by;
  return d;
}

std::vector<py::tuple> segments(int type) {
  std::vector<hpcmem_um_segment> buffer(hpcmem_um_segments(type, nullptr, 0) + 64);
  size_t n = hpcmem_um_segments(type, buffer.data(), buffer.size());
  std::vector<py::tuple> out;
  for (size_t i = 0; i < n && i < buffer.size(); ++i) {
    out.push_back(
        py::make_tuple(buffer[i].ptr, buffer[i].size, buffer[i].on_gpu != 0, buffer[i].epoch));
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_um, m) {
  m.doc() = "Bindings of libhpcmem_um, the per-type CUDA managed-memory allocator.";
  m.attr("PARAMS") = int(HPCMEM_UM_PARAMS);
  m.attr("ACTIVATIONS") = int(HPCMEM_UM_ACTIVATIONS);
  m.attr("INPUTS") = int(HPCMEM_UM_INPUTS);
  m.attr("LOC_NONE") = int(HPCMEM_UM_LOC_NONE);
  m.attr("LOC_GPU") = int(HPCMEM_UM_LOC_GPU);
  m.attr("LOC_CPU") = int(HPCMEM_UM_LOC_CPU);
  m.attr("CPU_ID") = int(HPCMEM_UM_CPU_ID);
  m.attr("INVALID_ID") = int(HPCMEM_UM_INVALID_ID);
  m.attr("UNLIMITED") = py::int_(UINT64_MAX);
  py::tuple type_names(static_cast<size_t>(HPCMEM_UM_NTYPES));
  for (int i = 0; i < HPCMEM_UM_NTYPES; ++i) type_names[i] = hpcmem_um_type_name(i);
  m.attr("TYPE_NAMES") = type_names;  // index = the type's id in every call below

  m.def("library_path", &library_path, "Path of libhpcmem_um.so (for CUDAPluggableAllocator).");
  m.def(
      "set_policy",
      [](int type, int preferred, int accessed_by, bool read_mostly, bool prefetch_on_alloc) {
        check(hpcmem_um_set_policy(type, make_policy(preferred, accessed_by, read_mostly,
                                                     prefetch_on_alloc)));
      },
      py::arg("type"), py::arg("preferred"), py::arg("accessed_by"), py::arg("read_mostly"),
      py::arg("prefetch_on_alloc"), "Set the policy applied to each new segment of a type.");
  m.def(
      "get_policy",
      [](int type) {
        hpcmem_um_policy p{};
        check(hpcmem_um_get_policy(type, &p));
        return py::make_tuple(p.preferred, p.accessed_by, p.read_mostly != 0,
                              p.prefetch_on_alloc != 0);
      },
      py::arg("type"), "(preferred, accessed_by, read_mostly, prefetch_on_alloc) of a type.");
  m.def("set_gpu_quota", [](int type, uint64_t n) { check(hpcmem_um_set_gpu_quota(type, n)); },
        py::arg("type"), py::arg("bytes"), "GPU-preferred bytes a type may hold (UNLIMITED: any).");
  m.def("set_limit", &hpcmem_um_set_limit, py::arg("bytes"),
        "The guard: managed bytes never exceed this (UNLIMITED: no limit).");
  m.def("limit", &hpcmem_um_limit, "The guard's limit in bytes.");
  m.def("managed_bytes", &hpcmem_um_managed_bytes, "Managed bytes held by live segments.");
  m.def("gpu_bytes", &hpcmem_um_gpu_bytes, "Bytes of live segments placed on the GPU, all types.");
  m.def("gpu_peak_bytes", &hpcmem_um_gpu_peak_bytes,
        "Highest gpu_bytes since the last reset_counters() or reset_gpu_peak().");
  m.def("reset_gpu_peak", &hpcmem_um_reset_gpu_peak, "gpu_peak_bytes := gpu_bytes now.");
  m.def("counters", &counters, py::arg("type"), "A type's counters as a dict.");
  m.def("reset_counters", &hpcmem_um_counters_reset,
        "Peaks := live; advice calls, prefetched bytes and refusals := 0.");
  m.def("segments", &segments, py::arg("type"),
        "Live segments of a type in allocation order: (ptr, size, on_gpu, epoch).");
  m.def("begin_epoch", &hpcmem_um_begin_epoch,
        "Start a new epoch (one per UnifiedMemory); returns its number.");
  m.def(
      "advise",
      [](std::uintptr_t ptr, size_t size, int device, int preferred, int accessed_by,
         bool read_mostly) {
        check(hpcmem_um_advise(ptr, size, device,
                               make_policy(preferred, accessed_by, read_mostly, false)));
      },
      py::arg("ptr"), py::arg("size"), py::arg("device"), py::arg("preferred"),
      py::arg("accessed_by"), py::arg("read_mostly"),
      "Set exactly this advice on a managed range (clearing what it does not ask for).");
  m.def(
      "prefetch",
      [](std::uintptr_t ptr, size_t size, int location, std::uintptr_t stream, int type) {
        check(hpcmem_um_prefetch(ptr, size, location, as_stream(stream), type));
      },
      py::arg("ptr"), py::arg("size"), py::arg("location"), py::arg("stream"),
      py::arg("type") = -1,
      "Prefetch a managed range (whole pages) to a device ordinal or CPU_ID on a stream.");
  m.def("range_attributes", &range_attributes, py::arg("ptr"), py::arg("size"),
        "The driver's view of a range: preferred_location, accessed_by, read_mostly, "
        "last_prefetch_location (device ordinals, CPU_ID, INVALID_ID).");
  m.def(
      "is_managed",
      [](std::uintptr_t ptr) {
        int rc = hpcmem_um_is_managed(ptr);
        if (rc < 0) throw std::runtime_error(hpcmem_um_last_error());
        return rc == 1;
      },
      py::arg("ptr"), "Whether a pointer is CUDA managed memory.");
}
