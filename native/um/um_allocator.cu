// libhpcmem_um: per-type managed-memory allocator (see hpcmem_um.h).
#include "hpcmem_um.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

const char* const kTypeNames[HPCMEM_UM_NTYPES] = {"params", "activations", "inputs"};
constexpr uint64_t kUnlimited = UINT64_MAX;
constexpr uintptr_t kPage = 4096;

struct Segment {
  size_t size;
  uint64_t seq;
  uint64_t epoch;
  bool on_gpu;
};

struct TypeState {
  hpcmem_um_policy policy{HPCMEM_UM_LOC_NONE, 0, 0, 0};
  uint64_t gpu_quota = kUnlimited;
  hpcmem_um_counters counters{};
  std::unordered_map<uintptr_t, Segment> segments;
};

struct State {
  std::mutex mutex;
  TypeState types[HPCMEM_UM_NTYPES];
  uint64_t limit = kUnlimited;
  uint64_t managed = 0;
  uint64_t gpu_total = 0;
  uint64_t gpu_peak = 0;  // highest gpu_total since the last counter reset
  uint64_t next_seq = 0;
  uint64_t epoch = 0;
};

State& state() {
  static State* s = new State();  // never destroyed: frees may arrive during interpreter exit
  return *s;
}

thread_local std::string t_last_error;

void set_error(std::string message) { t_last_error = std::move(message); }

std::string bytes_text(uint64_t n) { return std::to_string(n) + " bytes"; }

bool valid_type(int type) {
  if (type >= 0 && type < HPCMEM_UM_NTYPES) return true;
  set_error("hpcmem-um: type " + std::to_string(type) + " is not one of 0 (params), "
            "1 (activations), 2 (inputs)");
  return false;
}

// CUDA 13 takes a cudaMemLocation where CUDA 12 took a device ordinal.
#if CUDART_VERSION >= 13000
cudaMemLocation location_of(int id) {
  cudaMemLocation loc{};
  if (id == cudaCpuDeviceId) {
    loc.type = cudaMemLocationTypeHost;
    loc.id = 0;
  } else {
    loc.type = cudaMemLocationTypeDevice;
    loc.id = id;
  }
  return loc;
}
cudaError_t advise(const void* p, size_t n, cudaMemoryAdvise advice, int id) {
  return cudaMemAdvise(p, n, advice, location_of(id));
}
cudaError_t prefetch(const void* p, size_t n, int id, cudaStream_t stream) {
  return cudaMemPrefetchAsync(p, n, location_of(id), 0, stream);
}
#else
cudaError_t advise(const void* p, size_t n, cudaMemoryAdvise advice, int id) {
  return cudaMemAdvise(p, n, advice, id);
}
cudaError_t prefetch(const void* p, size_t n, int id, cudaStream_t stream) {
  return cudaMemPrefetchAsync(p, n, id, stream);
}
#endif

int location_id(int loc, int device) { return loc == HPCMEM_UM_LOC_CPU ? cudaCpuDeviceId : device; }

// Sets (and, unless `fresh`, clears) every advice of `policy` on [p, p+n). Counts calls.
cudaError_t apply_advice(const void* p, size_t n, int device, const hpcmem_um_policy& policy,
                         bool fresh, uint64_t* calls) {
  auto call = [&](cudaMemoryAdvise advice, int id) {
    ++*calls;
    return advise(p, n, advice, id);
  };
  cudaError_t err = cudaSuccess;
  if (policy.preferred != HPCMEM_UM_LOC_NONE) {
    err = call(cudaMemAdviseSetPreferredLocation, location_id(policy.preferred, device));
  } else if (!fresh) {
    err = call(cudaMemAdviseUnsetPreferredLocation, device);
  }
  for (int loc : {HPCMEM_UM_LOC_GPU, HPCMEM_UM_LOC_CPU}) {
    if (err != cudaSuccess) return err;
    if (policy.accessed_by & loc) {
      err = call(cudaMemAdviseSetAccessedBy, location_id(loc, device));
    } else if (!fresh) {
      err = call(cudaMemAdviseUnsetAccessedBy, location_id(loc, device));
    }
  }
  if (err != cudaSuccess) return err;
  if (policy.read_mostly) {
    err = call(cudaMemAdviseSetReadMostly, device);
  } else if (!fresh) {
    err = call(cudaMemAdviseUnsetReadMostly, device);
  }
  return err;
}

// Where a new segment of `type` goes: its policy, spilled to CPU-preferred + accessed-by
// GPU when a GPU-preferred segment does not fit in the type's quota (the GPU budget puts the
// params type on the host this way; its data is streamed from pinned copies).
hpcmem_um_policy place(const TypeState& t, size_t size, uint64_t type_gpu, bool* on_gpu) {
  hpcmem_um_policy p = t.policy;
  bool wants_gpu = p.preferred == HPCMEM_UM_LOC_GPU ||
                   (p.preferred == HPCMEM_UM_LOC_NONE && p.prefetch_on_alloc);
  bool fits = type_gpu + size <= t.gpu_quota && type_gpu + size >= type_gpu;
  *on_gpu = wants_gpu && fits;
  if (wants_gpu && !fits) {
    if (p.preferred == HPCMEM_UM_LOC_GPU) {
      p.preferred = HPCMEM_UM_LOC_CPU;
      p.accessed_by |= HPCMEM_UM_LOC_GPU;
    } else {
      p.prefetch_on_alloc = 0;
    }
  }
  return p;
}

int prefetch_target(const hpcmem_um_policy& p, int device) {
  return p.preferred == HPCMEM_UM_LOC_CPU ? cudaCpuDeviceId : device;
}

void* um_malloc(int type, size_t size, int device, void* stream) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  TypeState& t = s.types[type];
  const char* name = kTypeNames[type];
  if (size == 0) {
    set_error(std::string("hpcmem-um: refusing a 0-byte managed allocation for ") + name);
    return nullptr;
  }
  if (s.managed + size > s.limit || s.managed + size < s.managed) {
    ++t.counters.refusals;
    t.counters.last_refused_bytes = size;
    set_error("hpcmem-um guard: refused " + bytes_text(size) + " of managed memory for " + name +
              ": " + bytes_text(s.managed) + " are already managed and the limit is " +
              bytes_text(s.limit));
    return nullptr;
  }
  void* p = nullptr;
  cudaError_t err = cudaMallocManaged(&p, size, cudaMemAttachGlobal);
  if (err != cudaSuccess) {
    cudaGetLastError();
    set_error("hpcmem-um: cudaMallocManaged(" + bytes_text(size) + ") for " + name +
              " failed: " + cudaGetErrorString(err) + " (" + bytes_text(s.managed) +
              " managed before it)");
    return nullptr;
  }
  // Count first, undo on any failure below.
  bool on_gpu = false;
  hpcmem_um_policy placed = place(t, size, t.counters.gpu_bytes, &on_gpu);
  const hpcmem_um_counters saved = t.counters;
  const uint64_t saved_gpu_total = s.gpu_total;
  s.managed += size;
  if (on_gpu) {
    t.counters.gpu_bytes += size;
    s.gpu_total += size;
    s.gpu_peak = std::max(s.gpu_peak, s.gpu_total);
  }
  t.counters.live_bytes += size;
  t.counters.peak_bytes = std::max(t.counters.peak_bytes, t.counters.live_bytes);
  ++t.counters.segments;
  try {
    err = apply_advice(p, size, device, placed, true, &t.counters.advice_calls);
    if (err == cudaSuccess && placed.prefetch_on_alloc) {
      err = prefetch(p, size, prefetch_target(placed, device), static_cast<cudaStream_t>(stream));
      if (err == cudaSuccess) t.counters.prefetched_bytes += size;
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      set_error("hpcmem-um: placing a new " + bytes_text(size) + " segment for " + name +
                " failed: " + cudaGetErrorString(err));
    } else {
      t.segments.emplace(reinterpret_cast<uintptr_t>(p), Segment{size, s.next_seq++, s.epoch, on_gpu});
      return p;
    }
  } catch (...) {
    set_error("hpcmem-um: out of host memory recording a " + bytes_text(size) + " segment for " +
              name);
  }
  const uint64_t advice_calls = t.counters.advice_calls;
  t.counters = saved;
  t.counters.advice_calls = advice_calls;  // those calls were made
  s.gpu_total = saved_gpu_total;
  s.managed -= size;
  cudaFree(p);
  return nullptr;
}

void um_free(int type, void* ptr, size_t size, int device, void* stream) noexcept {
  (void)device;
  (void)stream;
  if (ptr == nullptr) return;
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    TypeState& t = s.types[type];
    auto it = t.segments.find(reinterpret_cast<uintptr_t>(ptr));
    if (it != t.segments.end()) {
      size = it->second.size;
      if (it->second.on_gpu) {
        t.counters.gpu_bytes -= size;
        s.gpu_total -= size;
      }
      t.segments.erase(it);
      t.counters.live_bytes -= size;
      --t.counters.segments;
      s.managed -= size;
    }
  }
  if (cudaFree(ptr) != cudaSuccess) cudaGetLastError();
}

}  // namespace

extern "C" {

#define HPCMEM_UM_PAIR(NAME, TYPE)                                                   \
  void* hpcmem_um_malloc_##NAME(size_t size, int device, void* stream) {             \
    return um_malloc(TYPE, size, device, stream);                                    \
  }                                                                                  \
  void hpcmem_um_free_##NAME(void* ptr, size_t size, int device, void* stream) {     \
    um_free(TYPE, ptr, size, device, stream);                                        \
  }
HPCMEM_UM_PAIR(params, HPCMEM_UM_PARAMS)
HPCMEM_UM_PAIR(activations, HPCMEM_UM_ACTIVATIONS)
HPCMEM_UM_PAIR(inputs, HPCMEM_UM_INPUTS)
#undef HPCMEM_UM_PAIR

int hpcmem_um_set_policy(int type, hpcmem_um_policy policy) {
  if (!valid_type(type)) return -1;
  if (policy.preferred < HPCMEM_UM_LOC_NONE || policy.preferred > HPCMEM_UM_LOC_CPU ||
      (policy.accessed_by & ~(HPCMEM_UM_LOC_GPU | HPCMEM_UM_LOC_CPU)) != 0) {
    set_error("hpcmem-um: bad policy for " + std::string(kTypeNames[type]) + ": preferred " +
              std::to_string(policy.preferred) + ", accessed_by mask " +
              std::to_string(policy.accessed_by));
    return -1;
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.types[type].policy = policy;
  return 0;
}

int hpcmem_um_get_policy(int type, hpcmem_um_policy* out) {
  if (!valid_type(type)) return -1;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  *out = s.types[type].policy;
  return 0;
}

int hpcmem_um_set_gpu_quota(int type, uint64_t bytes) {
  if (!valid_type(type)) return -1;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.types[type].gpu_quota = bytes;
  return 0;
}

void hpcmem_um_set_limit(uint64_t bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.limit = bytes;
}

uint64_t hpcmem_um_limit(void) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.limit;
}

uint64_t hpcmem_um_managed_bytes(void) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.managed;
}

uint64_t hpcmem_um_gpu_bytes(void) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.gpu_total;
}

uint64_t hpcmem_um_gpu_peak_bytes(void) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.gpu_peak;
}

void hpcmem_um_reset_gpu_peak(void) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.gpu_peak = s.gpu_total;
}

const char* hpcmem_um_type_name(int type) {
  return type >= 0 && type < HPCMEM_UM_NTYPES ? kTypeNames[type] : nullptr;
}

int hpcmem_um_counters_get(int type, hpcmem_um_counters* out) {
  if (!valid_type(type)) return -1;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  *out = s.types[type].counters;
  return 0;
}

void hpcmem_um_counters_reset(void) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.gpu_peak = s.gpu_total;
  for (TypeState& t : s.types) {
    t.counters.peak_bytes = t.counters.live_bytes;
    t.counters.advice_calls = 0;
    t.counters.prefetched_bytes = 0;
    t.counters.refusals = 0;
    t.counters.last_refused_bytes = 0;
  }
}

static std::vector<std::pair<uintptr_t, Segment>> ordered(const TypeState& t) {
  std::vector<std::pair<uintptr_t, Segment>> v(t.segments.begin(), t.segments.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.seq < b.second.seq; });
  return v;
}

size_t hpcmem_um_segments(int type, hpcmem_um_segment* out, size_t cap) {
  if (!valid_type(type)) return 0;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto v = ordered(s.types[type]);
  for (size_t i = 0; i < v.size() && i < cap; ++i) {
    out[i] = hpcmem_um_segment{v[i].first, v[i].second.size, v[i].second.on_gpu ? 1 : 0,
                               v[i].second.epoch};
  }
  return v.size();
}

uint64_t hpcmem_um_begin_epoch(void) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return ++s.epoch;
}

int hpcmem_um_advise(uintptr_t ptr, size_t size, int device, hpcmem_um_policy policy) {
  uint64_t calls = 0;
  cudaError_t err = apply_advice(reinterpret_cast<const void*>(ptr), size, device, policy, false, &calls);
  if (err != cudaSuccess) {
    cudaGetLastError();
    set_error("hpcmem-um: cudaMemAdvise on " + bytes_text(size) + " failed: " +
              cudaGetErrorString(err));
    return -1;
  }
  return 0;
}

int hpcmem_um_prefetch(uintptr_t ptr, size_t size, int location_id, void* stream, int type) {
  // Whole pages: the caching allocator hands out sub-page tensors inside page-aligned segments.
  uintptr_t begin = ptr & ~(kPage - 1);
  uintptr_t end = (ptr + size + kPage - 1) & ~(kPage - 1);
  cudaError_t err = prefetch(reinterpret_cast<const void*>(begin), end - begin, location_id,
                             static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) {
    cudaGetLastError();
    set_error("hpcmem-um: cudaMemPrefetchAsync of " + bytes_text(size) + " to location " +
              std::to_string(location_id) + " failed: " + cudaGetErrorString(err));
    return -1;
  }
  if (type >= 0 && type < HPCMEM_UM_NTYPES) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.types[type].counters.prefetched_bytes += end - begin;
  }
  return 0;
}

int hpcmem_um_range_attributes_get(uintptr_t ptr, size_t size, hpcmem_um_range_attributes* out) {
  const void* p = reinterpret_cast<const void*>(ptr);
  cudaError_t err = cudaMemRangeGetAttribute(&out->preferred_location, sizeof(int),
                                             cudaMemRangeAttributePreferredLocation, p, size);
  if (err == cudaSuccess) {
    err = cudaMemRangeGetAttribute(&out->last_prefetch_location, sizeof(int),
                                   cudaMemRangeAttributeLastPrefetchLocation, p, size);
  }
  if (err == cudaSuccess) {
    err = cudaMemRangeGetAttribute(&out->read_mostly, sizeof(int),
                                   cudaMemRangeAttributeReadMostly, p, size);
  }
  if (err == cudaSuccess) {
    err = cudaMemRangeGetAttribute(out->accessed_by, sizeof(out->accessed_by),
                                   cudaMemRangeAttributeAccessedBy, p, size);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    set_error("hpcmem-um: cudaMemRangeGetAttribute on " + bytes_text(size) + " failed: " +
              cudaGetErrorString(err));
    return -1;
  }
  return 0;
}

int hpcmem_um_is_managed(uintptr_t ptr) {
  cudaPointerAttributes attributes{};
  cudaError_t err = cudaPointerGetAttributes(&attributes, reinterpret_cast<const void*>(ptr));
  if (err != cudaSuccess) {
    cudaGetLastError();
    set_error(std::string("hpcmem-um: cudaPointerGetAttributes failed: ") + cudaGetErrorString(err));
    return -1;
  }
  return attributes.type == cudaMemoryTypeManaged ? 1 : 0;
}

const char* hpcmem_um_last_error(void) { return t_last_error.c_str(); }

}  // extern "C"
