// The UMF backend: each kind is a disjoint pool over UMF's OS-memory provider, whose NUMA
// mode and node list give the kind its policy (mbind(2) on every mapping it makes).
#include <umf.h>
#include <umf/experimental/memspace.h>
#include <umf/pools/pool_disjoint.h>
#include <umf/providers/provider_os_memory.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <stdexcept>
#include <system_error>

#include "allocator.hpp"
#include "placement.hpp"

#ifndef HPCMEM_UMF_VERSION
#error "HPCMEM_UMF_VERSION (the UMF release found by CMake) must be defined"
#endif

namespace hpcmem::hbw {
namespace {

// A kind without nodes to bind to (no HBW or DAX KMEM node): what check_available says.
constexpr int kNoNode = ENODEV;

void check(umf_result_t result, const std::string& what) {
  if (result != UMF_RESULT_SUCCESS) {
    throw std::runtime_error("UMF " + what + " failed (umf_result_t " +
                             std::to_string(static_cast<int>(result)) + ")");
  }
}

// The provider's parameters, destroyed with this scope (UMF copies them at creation).
class ProviderParams {
 public:
  ProviderParams() { check(umfOsMemoryProviderParamsCreate(&handle_), "OS provider params"); }
  ~ProviderParams() { umfOsMemoryProviderParamsDestroy(handle_); }
  ProviderParams(const ProviderParams&) = delete;
  ProviderParams& operator=(const ProviderParams&) = delete;
  umf_os_memory_provider_params_handle_t get() const noexcept { return handle_; }

 private:
  umf_os_memory_provider_params_handle_t handle_ = nullptr;
};

class PoolParams {
 public:
  PoolParams() { check(umfDisjointPoolParamsCreate(&handle_), "disjoint pool params"); }
  ~PoolParams() { umfDisjointPoolParamsDestroy(handle_); }
  PoolParams(const PoolParams&) = delete;
  PoolParams& operator=(const PoolParams&) = delete;
  umf_disjoint_pool_params_handle_t get() const noexcept { return handle_; }

 private:
  umf_disjoint_pool_params_handle_t handle_ = nullptr;
};

// A pool over OS memory placed by `mode` on `nodes` (none for the default policy).
umf_memory_pool_handle_t make_pool(const std::string& kind, umf_numa_mode_t mode,
                                   std::vector<unsigned> nodes) {
  ProviderParams provider_params;
  check(umfOsMemoryProviderParamsSetNumaMode(provider_params.get(), mode), kind + " NUMA mode");
  if (!nodes.empty()) {
    check(umfOsMemoryProviderParamsSetNumaList(provider_params.get(), nodes.data(),
                                               static_cast<unsigned>(nodes.size())),
          kind + " NUMA node list");
  }
  umf_memory_provider_handle_t provider = nullptr;
  check(umfMemoryProviderCreate(umfOsMemoryProviderOps(), provider_params.get(), &provider),
        kind + " OS memory provider");
  PoolParams pool_params;
  umf_memory_pool_handle_t pool = nullptr;
  const umf_result_t made = umfPoolCreate(umfDisjointPoolOps(), provider, pool_params.get(),
                                          UMF_POOL_CREATE_FLAG_OWN_PROVIDER, &pool);
  if (made != UMF_RESULT_SUCCESS) umfMemoryProviderDestroy(provider);
  check(made, kind + " disjoint pool");
  return pool;
}

class UmfAllocator final : public Allocator {
 public:
  // No nodes for a kind that needs them: it is unavailable and has no pool.
  UmfAllocator(std::string name, umf_numa_mode_t mode, std::vector<unsigned> nodes,
               bool needs_nodes)
      : name_(std::move(name)),
        pool_(needs_nodes && nodes.empty() ? nullptr : make_pool(name_, mode, std::move(nodes))) {}
  // Pools live as long as the process: NumPy may free arrays after static destructors.
  UmfAllocator(const UmfAllocator&) = delete;
  UmfAllocator& operator=(const UmfAllocator&) = delete;

  const std::string& name() const noexcept override { return name_; }

  int check_available() const noexcept override { return pool_ != nullptr ? 0 : kNoNode; }

  void* allocate(std::size_t bytes, std::size_t alignment) noexcept override {
    return pool_ != nullptr ? umfPoolAlignedMalloc(pool_, bytes, alignment) : nullptr;
  }

  void* allocate_zeroed(std::size_t count, std::size_t size) noexcept override {
    return pool_ != nullptr ? umfPoolCalloc(pool_, count, size) : nullptr;
  }

  void* reallocate(void* p, std::size_t bytes) noexcept override {
    return pool_ != nullptr ? umfPoolRealloc(pool_, p, bytes) : nullptr;
  }

  void deallocate(void* p) noexcept override {
    if (p != nullptr && pool_ != nullptr) umfPoolFree(pool_, p);
  }

 private:
  std::string name_;
  umf_memory_pool_handle_t pool_;
};

std::vector<unsigned> first_of(const std::vector<unsigned>& nodes) {
  return nodes.empty() ? nodes : std::vector<unsigned>{nodes.front()};
}

class UmfBackend final : public Backend {
 public:
  explicit UmfBackend(const Nodes& nodes)
      : hbw_(nodes.hbw),
        kinds_{
            std::make_unique<UmfAllocator>("dram", UMF_NUMA_MODE_DEFAULT,
                                           std::vector<unsigned>{}, false),
            std::make_unique<UmfAllocator>("hbw", UMF_NUMA_MODE_BIND, nodes.local_hbw, true),
            // MPOL_PREFERRED takes one node: the nearest HBW node
            std::make_unique<UmfAllocator>("hbw_preferred", UMF_NUMA_MODE_PREFERRED,
                                           first_of(nodes.local_hbw), true),
            std::make_unique<UmfAllocator>("hbw_interleave", UMF_NUMA_MODE_INTERLEAVE, nodes.hbw,
                                           true),
            std::make_unique<UmfAllocator>("dax_kmem", UMF_NUMA_MODE_BIND, nodes.dax_kmem, true),
        } {}

  const std::string& name() const noexcept override { return name_; }

  std::string version() const override { return HPCMEM_UMF_VERSION; }

  Allocator& allocator(const std::string& name) override {
    for (auto& kind : kinds_) {
      if (kind->name() == name) return *kind;
    }
    throw std::invalid_argument("UMF backend has no kind '" + name + "'");
  }

  int verify_hbw(void* address, std::size_t bytes) noexcept override {
    try {
      for (const auto& [node, pages] : page_nodes(reinterpret_cast<std::uintptr_t>(address),
                                                   bytes)) {
        const auto id = static_cast<unsigned>(node);
        if (node < 0 || std::find(hbw_.begin(), hbw_.end(), id) == hbw_.end()) return -1;
      }
      return 0;
    } catch (const std::system_error& error) {
      return error.code().value();
    }
  }

  std::optional<std::vector<unsigned>> highest_bandwidth_nodes() const override {
    umf_const_memspace_handle_t memspace = umfMemspaceHighestBandwidthGet();
    if (memspace == nullptr) return std::nullopt;  // no bandwidth attributes (no HMAT)
    std::vector<unsigned> nodes;
    for (unsigned i = 0; i < umfMemspaceMemtargetNum(memspace); ++i) {
      unsigned id = 0;
      if (umfMemtargetGetId(umfMemspaceMemtargetGet(memspace, i), &id) == UMF_RESULT_SUCCESS) {
        nodes.push_back(id);
      }
    }
    std::sort(nodes.begin(), nodes.end());
    return nodes;
  }

 private:
  std::string name_ = "umf";
  std::vector<unsigned> hbw_;
  std::array<std::unique_ptr<UmfAllocator>, 5> kinds_;
};

}  // namespace

std::unique_ptr<Backend> make_umf_backend(const Nodes& nodes) {
  check(umfInit(), "umfInit");  // never torn down: the pools live as long as the process
  return std::make_unique<UmfBackend>(nodes);
}

}  // namespace hpcmem::hbw
