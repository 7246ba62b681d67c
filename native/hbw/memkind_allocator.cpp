// The memkind backend: each kind is one of memkind's static kinds. memkind finds its HBW
// and DAX KMEM nodes itself, from MEMKIND_HBW_NODES and MEMKIND_DAX_KMEM_NODES when set;
// the nodes hpcmem found are handed to it through those variables before its first use.
#include <hbwmalloc.h>
#include <memkind.h>

#include <array>
#include <cstdlib>
#include <stdexcept>

#include "allocator.hpp"

namespace hpcmem::hbw {
namespace {

class MemkindAllocator final : public Allocator {
 public:
  // memkind's kinds are globals set up by the library: keep their address, read at use.
  MemkindAllocator(std::string name, memkind_t* kind) : name_(std::move(name)), kind_(kind) {}

  const std::string& name() const noexcept override { return name_; }

  int check_available() const noexcept override { return memkind_check_available(*kind_); }

  void* allocate(std::size_t bytes, std::size_t alignment) noexcept override {
    void* p = nullptr;
    return memkind_posix_memalign(*kind_, &p, alignment, bytes) == 0 ? p : nullptr;
  }

  void* allocate_zeroed(std::size_t count, std::size_t size) noexcept override {
    return memkind_calloc(*kind_, count, size);
  }

  void* reallocate(void* p, std::size_t bytes) noexcept override {
    return memkind_realloc(*kind_, p, bytes);
  }

  void deallocate(void* p) noexcept override {
    if (p != nullptr) memkind_free(*kind_, p);
  }

 private:
  std::string name_;
  memkind_t* kind_;
};

// "0,2,5": libnuma's node-list syntax, as memkind reads its variables.
std::string node_list(const std::vector<unsigned>& nodes) {
  std::string out;
  for (unsigned node : nodes) out += (out.empty() ? "" : ",") + std::to_string(node);
  return out;
}

void hand_over(const char* variable, const std::vector<unsigned>& nodes) {
  if (!nodes.empty()) setenv(variable, node_list(nodes).c_str(), 1);
}

class MemkindBackend final : public Backend {
 public:
  explicit MemkindBackend(const Nodes& nodes) {
    hand_over("MEMKIND_HBW_NODES", nodes.hbw);
    hand_over("MEMKIND_DAX_KMEM_NODES", nodes.dax_kmem);
  }

  const std::string& name() const noexcept override { return name_; }

  std::string version() const override {
    const int v = memkind_get_version();  // major * 1000000 + minor * 1000 + patch
    return std::to_string(v / 1000000) + "." + std::to_string(v / 1000 % 1000) + "." +
           std::to_string(v % 1000);
  }

  Allocator& allocator(const std::string& name) override {
    for (auto& kind : kinds_) {
      if (kind.name() == name) return kind;
    }
    throw std::invalid_argument("memkind backend has no kind '" + name + "'");
  }

  int verify_hbw(void* address, std::size_t bytes) noexcept override {
    return hbw_verify_memory_region(address, bytes, 0);
  }

  std::optional<std::vector<unsigned>> highest_bandwidth_nodes() const override {
    return std::nullopt;  // memkind ranks no nodes for its callers
  }

 private:
  std::string name_ = "memkind";
  std::array<MemkindAllocator, 5> kinds_{
      MemkindAllocator("dram", &MEMKIND_DEFAULT),
      MemkindAllocator("hbw", &MEMKIND_HBW),
      MemkindAllocator("hbw_preferred", &MEMKIND_HBW_PREFERRED),
      MemkindAllocator("hbw_interleave", &MEMKIND_HBW_INTERLEAVE),
      MemkindAllocator("dax_kmem", &MEMKIND_DAX_KMEM),
  };
};

}  // namespace

std::unique_ptr<Backend> make_memkind_backend(const Nodes& nodes) {
  return std::make_unique<MemkindBackend>(nodes);
}

}  // namespace hpcmem::hbw
