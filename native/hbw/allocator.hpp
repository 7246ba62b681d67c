// The memory kinds behind one small interface: memkind today, UMF later (docs/design.md).
#pragma once

#include <cstddef>
#include <new>
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

/// The kind names, in the order of hpcmem.hbw.KINDS.
const std::vector<std::string>& kind_names();

/// The allocator of kind `name`; std::invalid_argument listing the kinds otherwise.
/// Allocators live as long as the process (NumPy may free arrays during shutdown).
Allocator& allocator(const std::string& name);

/// The backend and its version, e.g. "1.14.0" for memkind 1.14.0.
std::string backend_version();

/// An allocation that failed; the message names the kind and the byte count.
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
