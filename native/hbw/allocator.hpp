// The memory kinds behind one small interface, served by a placement backend: UMF (Intel's
// Unified Memory Framework) or memkind, whichever were found at build time (docs/design.md).
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

namespace hpcmem::hbw {

/// One memory kind. Every method is noexcept: failures are nullptr or an error code.
class Allocator {
 public:
  virtual ~Allocator() = default;
  /// The kind's name as hpcmem spells it everywhere: dram, hbw, hbw_preferred, ...
  virtual const std::string& name() const noexcept = 0;
  /// 0 when the kind can allocate on this machine, else the backend's error code.
  virtual int check_available() const noexcept = 0;
  /// `bytes` bytes aligned to `alignment` (a power of two), or nullptr.
  virtual void* allocate(std::size_t bytes, std::size_t alignment) noexcept = 0;
  /// `count * size` zeroed bytes, or nullptr.
  virtual void* allocate_zeroed(std::size_t count, std::size_t size) noexcept = 0;
  /// `p` resized to `bytes` (contents kept), or nullptr with `p` untouched.
  virtual void* reallocate(void* p, std::size_t bytes) noexcept = 0;
  /// Return `p` (nullptr allowed) to the kind it came from.
  virtual void deallocate(void* p) noexcept = 0;
};

/// The NUMA nodes hpcmem found (hpcmem.node.topology): a backend binds its kinds to them.
struct Nodes {
  std::vector<unsigned> hbw;        // every high-bandwidth node (hbw_interleave)
  std::vector<unsigned> local_hbw;  // the HBW nodes nearest this process's CPUs (hbw)
  std::vector<unsigned> dax_kmem;   // CXL or persistent memory as system RAM (dax_kmem)
  bool operator==(const Nodes& other) const {
    return hbw == other.hbw && local_hbw == other.local_hbw && dax_kmem == other.dax_kmem;
  }
};

/// A placement library serving every kind of kind_names().
class Backend {
 public:
  virtual ~Backend() = default;
  /// "umf" or "memkind".
  virtual const std::string& name() const noexcept = 0;
  /// The library's release, e.g. "1.2.0".
  virtual std::string version() const = 0;
  /// The allocator of kind `name`, one of kind_names().
  virtual Allocator& allocator(const std::string& name) = 0;
  /// 0 when every page of the range is on a node the backend serves `hbw` from, -1 when
  /// some page is not, an errno value when it cannot tell.
  virtual int verify_hbw(void* address, std::size_t bytes) noexcept = 0;
  /// The nodes the library itself ranks highest in bandwidth from each CPU node (UMF's
  /// HIGHEST_BANDWIDTH memspace, from hwloc's HMAT attributes); nullopt when it has no view.
  virtual std::optional<std::vector<unsigned>> highest_bandwidth_nodes() const = 0;
};

/// The kind names, in the order of hpcmem.hbw.KINDS.
const std::vector<std::string>& kind_names();

/// The backends built in, the default first.
const std::vector<std::string>& backend_names();

/// Make `name` the backend of this process, bound to `nodes`. Once per process: again with
/// the same arguments does nothing, with others std::logic_error; an unknown or not built
/// backend is std::invalid_argument listing the built ones.
void configure(const std::string& name, const Nodes& nodes);

/// The configured backend; std::logic_error before configure().
Backend& backend();

/// The allocator of kind `name` of the configured backend; std::invalid_argument listing
/// the kinds when there is no such kind. Allocators live as long as the process (NumPy may
/// free arrays during shutdown).
Allocator& allocator(const std::string& name);

/// Each backend's factory (defined where the backend is built in).
std::unique_ptr<Backend> make_umf_backend(const Nodes& nodes);
std::unique_ptr<Backend> make_memkind_backend(const Nodes& nodes);

/// An allocation that failed; the message names the backend, the kind and the byte count.
class AllocationError : public std::bad_alloc {
 public:
  explicit AllocationError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

/// Memory of one kind owned for its whole life (RAII): freed by that kind on destruction.
class Buffer {
 public:
  /// `bytes` bytes of `kind` (at least one byte is allocated, so zero works);
  /// with `zero` every byte is written, which also places every page now.
  Buffer(Allocator& kind, std::size_t bytes, bool zero);
  ~Buffer() { kind_.deallocate(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  const Allocator& kind() const noexcept { return kind_; }

 private:
  Allocator& kind_;
  std::size_t size_;
  void* data_;
};

}  // namespace hpcmem::hbw
