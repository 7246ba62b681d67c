// The Allocator interface implemented with memkind kinds.
#include <memkind.h>

#include <array>
#include <cstring>
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

using Table = std::array<MemkindAllocator, 5>;

Table& table() {
  // Never destroyed: arrays may be freed by NumPy after static destructors would run.
  static Table* kinds = new Table{
      MemkindAllocator("dram", &MEMKIND_DEFAULT),
      MemkindAllocator("hbw", &MEMKIND_HBW),
      MemkindAllocator("hbw_preferred", &MEMKIND_HBW_PREFERRED),
      MemkindAllocator("hbw_interleave", &MEMKIND_HBW_INTERLEAVE),
      MemkindAllocator("dax_kmem", &MEMKIND_DAX_KMEM),
  };
  return *kinds;
}

constexpr std::size_t kAlignment = 64;  // a cache line: enough for every NumPy dtype

}  // namespace

const std::vector<std::string>& kind_names() {
  static const std::vector<std::string>* names = [] {
    auto* out = new std::vector<std::string>;
    for (const auto& kind : table()) out->push_back(kind.name());
    return out;
  }();
  return *names;
}

Allocator& allocator(const std::string& name) {
  for (auto& kind : table()) {
    if (kind.name() == name) return kind;
  }
  std::string valid;
  for (const auto& known : kind_names()) valid += (valid.empty() ? "" : ", ") + known;
  throw std::invalid_argument("kind '" + name + "' is not one of " + valid);
}

std::string backend_version() {
  const int v = memkind_get_version();  // major * 1000000 + minor * 1000 + patch
  return std::to_string(v / 1000000) + "." + std::to_string(v / 1000 % 1000) + "." +
         std::to_string(v % 1000);
}

Buffer::Buffer(Allocator& kind, std::size_t bytes, bool zero)
    : kind_(kind), size_(bytes), data_(kind.allocate(bytes == 0 ? 1 : bytes, kAlignment)) {
  if (data_ == nullptr) {
    throw AllocationError("memkind kind '" + kind.name() + "': cannot allocate " +
                          std::to_string(bytes) + " bytes");
  }
  if (zero) std::memset(data_, 0, size_);
}

}  // namespace hpcmem::hbw
