// The backends built in, the one this process configured, and Buffer over its kinds.
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "allocator.hpp"

namespace hpcmem::hbw {
namespace {

constexpr std::size_t kAlignment = 64;  // a cache line: enough for every NumPy dtype

using Factory = std::unique_ptr<Backend> (*)(const Nodes&);

struct Entry {
  std::string name;
  Factory make;
};

// Preference order: UMF is maintained, memkind discontinued (its last release is 2022).
const std::vector<Entry>& entries() {
  static const auto* built = new std::vector<Entry>{
#ifdef HPCMEM_HAVE_UMF
      {"umf", make_umf_backend},
#endif
#ifdef HPCMEM_HAVE_MEMKIND
      {"memkind", make_memkind_backend},
#endif
  };
  return *built;
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& word : words) out += (out.empty() ? "" : ", ") + word;
  return out;
}

std::string listed(const std::vector<unsigned>& nodes) {
  std::string out = "[";
  for (unsigned node : nodes) out += (out.size() > 1 ? "," : "") + std::to_string(node);
  return out + "]";
}

std::string describe(const std::string& name, const Nodes& nodes) {
  return name + " (hbw " + listed(nodes.hbw) + ", local " + listed(nodes.local_hbw) +
         ", dax_kmem " + listed(nodes.dax_kmem) + ")";
}

struct Configured {
  std::mutex lock;
  std::string name;
  Nodes nodes;
  Backend* backend = nullptr;  // never destroyed: NumPy may free arrays at shutdown
};

Configured& configured() {
  static auto* state = new Configured;
  return *state;
}

}  // namespace

const std::vector<std::string>& kind_names() {
  static const auto* names =
      new std::vector<std::string>{"dram", "hbw", "hbw_preferred", "hbw_interleave", "dax_kmem"};
  return *names;
}

const std::vector<std::string>& backend_names() {
  static const auto* names = [] {
    auto* out = new std::vector<std::string>;
    for (const auto& entry : entries()) out->push_back(entry.name);
    return out;
  }();
  return *names;
}

void configure(const std::string& name, const Nodes& nodes) {
  Configured& state = configured();
  std::lock_guard<std::mutex> guard(state.lock);
  if (state.backend != nullptr) {
    if (state.name == name && state.nodes == nodes) return;
    throw std::logic_error("hpcmem._hbw is configured as " + describe(state.name, state.nodes) +
                           " for this process; it cannot become " + describe(name, nodes));
  }
  for (const auto& entry : entries()) {
    if (entry.name != name) continue;
    state.backend = entry.make(nodes).release();
    state.name = name;
    state.nodes = nodes;
    return;
  }
  throw std::invalid_argument("backend '" + name + "' is not built in (built: " +
                              (entries().empty() ? "none" : joined(backend_names())) + ")");
}

Backend& backend() {
  Configured& state = configured();
  std::lock_guard<std::mutex> guard(state.lock);
  if (state.backend == nullptr) throw std::logic_error("hpcmem._hbw: configure() a backend first");
  return *state.backend;
}

Allocator& allocator(const std::string& name) {
  for (const auto& known : kind_names()) {
    if (known == name) return backend().allocator(name);
  }
  throw std::invalid_argument("kind '" + name + "' is not one of " + joined(kind_names()));
}

Buffer::Buffer(Allocator& kind, std::size_t bytes, bool zero)
    : kind_(kind), size_(bytes), data_(kind.allocate(bytes == 0 ? 1 : bytes, kAlignment)) {
  if (data_ == nullptr) {
    throw AllocationError(backend().name() + " kind '" + kind.name() + "': cannot allocate " +
                          std::to_string(bytes) + " bytes");
  }
  if (zero) std::memset(data_, 0, size_);
}

}  // namespace hpcmem::hbw
