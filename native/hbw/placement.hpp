// Where the pages of an address range live, measured with move_pages(2) in query mode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace hpcmem::hbw {

/// The system page size in bytes.
std::size_t page_size() noexcept;

/// Pages of [address, address + bytes) counted by NUMA node. A non-negative key is a
/// node id; a negative key is -errno for pages not placed (never touched, not mapped or
/// the shared zero page: -ENOENT or -EFAULT, as the kernel has it). A page NUMA balancing
/// hid from move_pages(2) is faulted in and counted on its node. Throws std::system_error
/// (with the byte count) when the kernel refuses the query, e.g. EPERM in a container
/// without CAP_SYS_NICE.
std::map<int, std::size_t> page_nodes(std::uintptr_t address, std::size_t bytes);

/// Pages of [address, address + bytes) counted by the memory policy that governs them,
/// spelled as in /proc/PID/numa_maps ("default", "bind:0", "prefer:1", "interleave:0-3",
/// "local"); a mapping without its own policy counts under the thread's policy (as
/// numactl set it); pages outside every mapping count as "unmapped". One get_mempolicy(2)
/// per mapping. Throws std::system_error when the kernel refuses the query.
std::map<std::string, std::size_t> page_policies(std::uintptr_t address, std::size_t bytes);

}  // namespace hpcmem::hbw
