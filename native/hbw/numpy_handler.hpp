// NEP-49: one NumPy memory handler per kind, so arrays made in a scope use that kind.
#pragma once

#include <pybind11/pybind11.h>

#include "allocator.hpp"

namespace hpcmem::hbw {

/// Load NumPy's C API; call once from module initialisation.
void import_numpy();

/// A capsule named "mem_handler" holding the PyDataMem_Handler of `kind`; its name is
/// "hpcmem_<backend>_<kind>" (hpcmem_umf_hbw). The handler lives as long as the process.
pybind11::capsule handler(Allocator& kind);

/// PyDataMem_SetHandler: install `capsule` (None: NumPy's default) in the current
/// context and return the handler it replaces.
pybind11::object set_handler(pybind11::object capsule);

}  // namespace hpcmem::hbw
