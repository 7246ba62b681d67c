// hpcmem_um: a CUDA managed-memory allocator for torch.cuda.memory.CUDAPluggableAllocator.
//
// One malloc/free pair per data type (params, activations, inputs). Every new segment gets
// its type's policy (preferred location, accessed-by, read-mostly, prefetch on allocation),
// a per-type quota decides whether a GPU-preferred segment fits on the GPU or spills to the CPU,
// and the oversubscription guard refuses any segment that would take the managed total past
// the limit (returning NULL, so PyTorch raises its out-of-memory error).
//
// This header is CUDA-free on purpose: the pybind11 module (hpcmem._um) includes it and
// compiles as plain C++. Streams are passed as void* (a cudaStream_t).
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { HPCMEM_UM_PARAMS = 0, HPCMEM_UM_ACTIVATIONS = 1, HPCMEM_UM_INPUTS = 2, HPCMEM_UM_NTYPES = 3 };

// Locations: a type's preferred location, and the bits of its accessed-by set.
enum { HPCMEM_UM_LOC_NONE = 0, HPCMEM_UM_LOC_GPU = 1, HPCMEM_UM_LOC_CPU = 2 };

// What the driver reports for a location: a device ordinal, or one of these.
enum { HPCMEM_UM_CPU_ID = -1, HPCMEM_UM_INVALID_ID = -2 };

typedef struct {
  int preferred;          // HPCMEM_UM_LOC_*
  int accessed_by;        // bit mask of HPCMEM_UM_LOC_GPU | HPCMEM_UM_LOC_CPU
  int read_mostly;        // 0 or 1
  int prefetch_on_alloc;  // 0 or 1: prefetch each new segment to where it is preferred
} hpcmem_um_policy;

typedef struct {
  uint64_t live_bytes;        // managed bytes held by live segments
  uint64_t peak_bytes;        // highest live_bytes since the last reset
  uint64_t segments;          // live segments
  uint64_t gpu_bytes;         // live bytes placed GPU-preferred (inside the quota)
  uint64_t advice_calls;      // cudaMemAdvise calls made
  uint64_t prefetched_bytes;  // bytes handed to cudaMemPrefetchAsync
  uint64_t refusals;          // segments refused by the guard
  uint64_t last_refused_bytes;  // size of the last refused segment
} hpcmem_um_counters;

typedef struct {
  int preferred_location;      // device ordinal, HPCMEM_UM_CPU_ID or HPCMEM_UM_INVALID_ID
  int last_prefetch_location;  // likewise
  int read_mostly;             // 0 or 1
  int accessed_by[8];          // device ordinals / HPCMEM_UM_CPU_ID, HPCMEM_UM_INVALID_ID-padded
} hpcmem_um_range_attributes;

typedef struct {
  uintptr_t ptr;
  size_t size;
  int on_gpu;      // placed GPU-preferred (counts towards the quota)
  uint64_t epoch;  // the epoch it was allocated in (see hpcmem_um_begin_epoch)
} hpcmem_um_segment;

// Allocator entry points (the CUDAPluggableAllocator signatures).
void* hpcmem_um_malloc_params(size_t size, int device, void* stream);
void hpcmem_um_free_params(void* ptr, size_t size, int device, void* stream);
void* hpcmem_um_malloc_activations(size_t size, int device, void* stream);
void hpcmem_um_free_activations(void* ptr, size_t size, int device, void* stream);
void* hpcmem_um_malloc_inputs(size_t size, int device, void* stream);
void hpcmem_um_free_inputs(void* ptr, size_t size, int device, void* stream);

// Configuration. All return 0 on success, -1 on a bad argument (see hpcmem_um_last_error).
int hpcmem_um_set_policy(int type, hpcmem_um_policy policy);
int hpcmem_um_get_policy(int type, hpcmem_um_policy* out);
int hpcmem_um_set_gpu_quota(int type, uint64_t bytes);  // UINT64_MAX: no per-type quota
void hpcmem_um_set_limit(uint64_t bytes);                // guard; UINT64_MAX: no limit
uint64_t hpcmem_um_limit(void);
uint64_t hpcmem_um_managed_bytes(void);
uint64_t hpcmem_um_gpu_bytes(void);       // bytes of live segments placed on the GPU, all types
uint64_t hpcmem_um_gpu_peak_bytes(void);  // highest of those since the last reset of either kind
void hpcmem_um_reset_gpu_peak(void);      // that peak := bytes placed on the GPU now
const char* hpcmem_um_type_name(int type);  // "params", ...; NULL outside 0..NTYPES-1

// Starts a new epoch (one per UnifiedMemory) and returns it: segments remember the epoch they
// were made in, so one job's segments are told apart from those an earlier job left alive.
uint64_t hpcmem_um_begin_epoch(void);

// Counters.
int hpcmem_um_counters_get(int type, hpcmem_um_counters* out);
void hpcmem_um_counters_reset(void);  // peaks := live; advice, prefetch, refusal counts := 0

// Segments of a type in allocation order; returns how many exist (writes at most `cap`).
size_t hpcmem_um_segments(int type, hpcmem_um_segment* out, size_t cap);
// Range operations on managed memory (errors: -1, message in hpcmem_um_last_error).
int hpcmem_um_advise(uintptr_t ptr, size_t size, int device, hpcmem_um_policy policy);
int hpcmem_um_prefetch(uintptr_t ptr, size_t size, int location_id, void* stream, int type);
int hpcmem_um_range_attributes_get(uintptr_t ptr, size_t size, hpcmem_um_range_attributes* out);
int hpcmem_um_is_managed(uintptr_t ptr);  // 1 managed, 0 not, -1 error

const char* hpcmem_um_last_error(void);  // this thread's last error message ("" if none)

#ifdef __cplusplus
}
#endif
