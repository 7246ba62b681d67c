// Where pages are: move_pages(2) with nodes == NULL reports the node of each page without
// moving it; get_mempolicy(2) with MPOL_F_ADDR reports the policy of each mapping.
//
// Automatic NUMA balancing (kernel.numa_balancing, on by default on multi-node hosts) maps
// sampled pages PROT_NONE to catch the next access. Some kernels' move_pages(2) reports such
// a page as not placed (-EFAULT, as for a page never touched): measured on Debian 12's 6.1,
// where every page of a written default-policy array read so within seconds of being
// written. /proc/self/pagemap still shows them present, and get_mempolicy(2) finds their
// node through the fault path (find_hidden_pages). A page never touched is not present and
// is not faulted in.
#include "placement.hpp"

#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace hpcmem::hbw {
namespace {

std::string hex(std::uintptr_t value) {
  char text[2 * sizeof value + 3];
  std::snprintf(text, sizeof text, "0x%zx", static_cast<std::size_t>(value));
  return text;
}

// The nodes of a mask in numa_maps' list form: "0-2,5".
std::string node_list(const std::vector<unsigned long>& mask) {
  constexpr std::size_t kBits = sizeof(unsigned long) * CHAR_BIT;
  std::string out;
  const std::size_t n = mask.size() * kBits;
  for (std::size_t node = 0; node < n;) {
    if (!(mask[node / kBits] >> (node % kBits) & 1UL)) {
      ++node;
      continue;
    }
    std::size_t last = node;
    while (last + 1 < n && (mask[(last + 1) / kBits] >> ((last + 1) % kBits) & 1UL)) ++last;
    out += (out.empty() ? "" : ",") + std::to_string(node);
    if (last > node) out += "-" + std::to_string(last);
    node = last + 1;
  }
  return out;
}

// The policy governing `address` (nullptr: the calling thread's), in numa_maps' spelling.
std::string policy_of(void* address) {
  constexpr std::size_t kBits = sizeof(unsigned long) * CHAR_BIT;
  const std::size_t possible = static_cast<std::size_t>(numa_num_possible_nodes());
  std::vector<unsigned long> mask((possible + kBits - 1) / kBits);
  int mode = 0;
  const unsigned long flags = address == nullptr ? 0 : MPOL_F_ADDR;
  if (get_mempolicy(&mode, mask.data(), mask.size() * kBits, address, flags) != 0) {
    const std::string what = address == nullptr
                                 ? std::string("the thread")
                                 : hex(reinterpret_cast<std::uintptr_t>(address));
    throw std::system_error(errno, std::generic_category(), "get_mempolicy of " + what);
  }
  const std::string nodes = node_list(mask);
  switch (mode & 0xff) {  // the high bits are mode flags (static/relative nodes)
    case MPOL_DEFAULT:
      return "default";
    case MPOL_PREFERRED:
      return nodes.empty() ? "local" : "prefer:" + nodes;
    case MPOL_BIND:
      return "bind:" + nodes;
    case MPOL_INTERLEAVE:
      return "interleave:" + nodes;
#ifdef MPOL_LOCAL
    case MPOL_LOCAL:
      return "local";
#endif
#ifdef MPOL_PREFERRED_MANY  // libnuma >= 2.0.15
    case MPOL_PREFERRED_MANY:
      return "prefer (many):" + nodes;
#endif
    default:
      return "mode " + std::to_string(mode) + ":" + nodes;
  }
}

// /proc/self/pagemap bits (Documentation/admin-guide/mm/pagemap.rst): readable by the
// process itself, without the frame numbers unless it is privileged.
constexpr std::uint64_t kPresent = 1ULL << 63, kExclusive = 1ULL << 56;

// Gives its node to each page move_pages(2) reported not placed that is present and mapped
// by this process alone: one NUMA balancing mapped PROT_NONE. get_mempolicy(2)'s node
// lookup reads it, taking the hinting fault the program's next access would take, and says
// where it is after it. The zero pages (read-only pages of zeros, 4 KiB or huge) are mapped
// by all, never exclusively, and stay not placed; so do hidden pages another process maps
// too. Without pagemap, statuses stay as reported.
void find_hidden_pages(void* const* pages, int* status, std::size_t n) {
  if (std::none_of(status, status + n, [](int s) { return s < 0; })) return;
  const int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (pagemap < 0) return;
  std::vector<std::uint64_t> entries(n);
  const auto bytes = static_cast<ssize_t>(n * sizeof(std::uint64_t));
  const auto offset = static_cast<off_t>(reinterpret_cast<std::uintptr_t>(pages[0]) /
                                         page_size() * sizeof(std::uint64_t));
  const bool read = pread(pagemap, entries.data(), bytes, offset) == bytes;
  close(pagemap);
  for (std::size_t i = 0; read && i < n; ++i) {
    const std::uint64_t entry = entries[i];
    int node = -1;
    if (status[i] < 0 && (entry & kPresent) && (entry & kExclusive) &&
        get_mempolicy(&node, nullptr, 0, pages[i], MPOL_F_NODE | MPOL_F_ADDR) == 0) {
      status[i] = node;
    }
  }
}

}  // namespace

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
      throw std::system_error(
          errno, std::generic_category(),
          "move_pages query of " + std::to_string(bytes) + " bytes at " + hex(address));
    }
    find_hidden_pages(pages.data(), status.data(), n);
    for (std::size_t i = 0; i < n; ++i) ++counts[status[i]];
  }
  return counts;
}

std::map<std::string, std::size_t> page_policies(std::uintptr_t address, std::size_t bytes) {
  std::map<std::string, std::size_t> counts;
  if (bytes == 0) return counts;
  const std::uintptr_t page = page_size();
  const std::uintptr_t first = address & ~(page - 1);
  const std::uintptr_t end = (address + bytes + page - 1) & ~(page - 1);
  const std::string thread_policy = policy_of(nullptr);
  std::ifstream maps("/proc/self/maps");
  if (!maps) throw std::system_error(errno, std::generic_category(), "open /proc/self/maps");
  std::size_t mapped = 0;
  std::string line;
  while (std::getline(maps, line)) {
    const std::size_t dash = line.find('-');
    const std::uintptr_t low = std::stoull(line.substr(0, dash), nullptr, 16);
    const std::uintptr_t high = std::stoull(line.substr(dash + 1), nullptr, 16);
    const std::uintptr_t from = std::max(low, first), to = std::min(high, end);
    if (from >= to) continue;
    std::string policy = policy_of(reinterpret_cast<void*>(from));
    counts[policy == "default" ? thread_policy : policy] += (to - from) / page;
    mapped += (to - from) / page;
  }
  const std::size_t total = (end - first) / page;
  if (mapped < total) counts["unmapped"] += total - mapped;
  return counts;
}

}  // namespace hpcmem::hbw
