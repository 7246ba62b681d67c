// move_pages(2) with nodes == NULL reports the node of each page without moving it.
#include "placement.hpp"

#include <hbwmalloc.h>
#include <numaif.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <system_error>
#include <vector>

namespace hpcmem::hbw {

std::size_t page_size() noexcept { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

std::map<int, std::size_t> page_nodes(std::uintptr_t address, std::size_t bytes) {
  std::map<int, std::size_t> counts;
  if (bytes == 0) return counts;
  const std::uintptr_t page = page_size();
  const std::uintptr_t first = address & ~(page - 1);
  const std::size_t total = (address + bytes - first + page - 1) / page;
  constexpr std::size_t kBatch = 4096;  // pages per system call
  std::vector<void*> pages(std::min(total, kBatch));
  std::vector<int> status(pages.size());
  for (std::size_t done = 0; done < total; done += pages.size()) {
    const std::size_t n = std::min(kBatch, total - done);
    for (std::size_t i = 0; i < n; ++i) {
      pages[i] = reinterpret_cast<void*>(first + (done + i) * page);
    }
    if (move_pages(0, n, pages.data(), nullptr, status.data(), 0) != 0) {
      throw std::system_error(errno, std::generic_category(),
                              "move_pages query of " + std::to_string(bytes) + " bytes at 0x" +
                                  [&] {
                                    char hex[2 * sizeof address + 1];
                                    std::snprintf(hex, sizeof hex, "%zx",
                                                  static_cast<std::size_t>(address));
                                    return std::string(hex);
                                  }());
    }
    for (std::size_t i = 0; i < n; ++i) ++counts[status[i]];
  }
  return counts;
}

int verify_hbw(std::uintptr_t address, std::size_t bytes) noexcept {
  return hbw_verify_memory_region(reinterpret_cast<void*>(address), bytes, 0);
}

}  // namespace hpcmem::hbw
