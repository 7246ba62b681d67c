// The Adam kernel, compiled once per instruction set from one body and chosen at run time.
//
// The body is plain C++ that the compiler vectorizes; each entry point below inlines it under
// its own target attribute, so one source gives the AVX-512, AVX2 and baseline versions.
// Floating-point contraction is off for this file (CMakeLists.txt): the versions then give
// bit-identical results, on any CPU.
#include "adam.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>

namespace hpcmem::optim {
namespace {

/// A value held as fp32, or as the bits of a bf16, in fp32.
inline float widen(float value) { return value; }

inline float widen(std::uint16_t bits16) {
  std::uint32_t bits = static_cast<std::uint32_t>(bits16) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline float load(const void* base, Dtype dtype, std::size_t i) {
  if (dtype == Dtype::float32) return static_cast<const float*>(base)[i];
  return widen(static_cast<const std::uint16_t*>(base)[i]);
}

/// fp32 to bf16, rounding to nearest even; NaN stays a (quiet) NaN.
inline std::uint16_t to_bfloat16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  std::uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>(value != value ? 0x7FC0u : rounded);
}

/// fp32 to bf16, rounding stochastically: up with probability (the dropped 16 bits) / 2^16,
/// so that the rounding is exact on average and updates smaller than half a bf16 step (the
/// second moment's, 1 - beta2 = 0.001 of it) still count; `noise` gives the 16 random bits.
inline std::uint16_t to_bfloat16_stochastic(float value, std::uint32_t noise) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  std::uint32_t rounded = (bits + (noise & 0xFFFFu)) >> 16;  // infinities stay infinite
  return static_cast<std::uint16_t>(value != value ? 0x7FC0u : rounded);
}

/// 32 random bits for element `i` of a step: murmur3's finalizer (full avalanche) of the
/// element's index offset by the step's seed; the same on every instruction set and thread
/// count.
inline std::uint32_t noise_of(std::uint32_t seed, std::size_t i) {
  std::uint32_t x = static_cast<std::uint32_t>(i) + seed;
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  return x ^ (x >> 16);
}

/// How moments in `S` are held: fp32 as they are, bf16 as their bits.
template <Dtype S>
using StateType = std::conditional_t<S == Dtype::float32, float, std::uint16_t>;

inline float narrow(float value, std::uint32_t, float) { return value; }

inline std::uint16_t narrow(float value, std::uint32_t noise, std::uint16_t) {
  return to_bfloat16_stochastic(value, noise);
}

/// One element range of the step: moments in `S`; AdamW's decay (`Decoupled`) or Adam's L2
/// term; `Write`: also write the working weights as `O`.
template <Dtype S, Dtype G, bool Decoupled, bool Write, Dtype O>
__attribute__((always_inline)) inline void body(const AdamStep& s, const AdamTensors& t,
                                                std::size_t begin, std::size_t end) {
  // locals, not the structs' fields: stores through the pointers could alias those, which
  // keeps the compiler from vectorizing
  using State = StateType<S>;
  float* __restrict master = t.master;
  State* __restrict m = static_cast<State*>(t.exp_avg);
  State* __restrict v = static_cast<State*>(t.exp_avg_sq);
  const void* __restrict grad = t.grad;
  void* __restrict out = t.out;
  const float beta2 = s.beta2, eps = s.eps, step_size = s.step_size;
  const float correction2 = s.bias_correction2_sqrt, decay = s.decay_factor, l2 = s.l2;
  const float sign = s.sign, one_minus_beta1 = s.one_minus_beta1;
  const float one_minus_beta2 = s.one_minus_beta2;
  const std::uint32_t seed = s.seed;
  for (std::size_t i = begin; i < end; ++i) {
    // no branch on run-time values, so that the loop vectorizes; the sign is +-1 (exact)
    float g = sign * load(grad, G, i);
    if constexpr (!Decoupled) g = g + l2 * master[i];
    const float m_old = widen(m[i]);
    const float mi = m_old + one_minus_beta1 * (g - m_old);
    const float vi = beta2 * widen(v[i]) + one_minus_beta2 * g * g;
    const float denom = std::sqrt(vi) / correction2 + eps;
    const float decayed = Decoupled ? master[i] * decay : master[i];
    const float p = decayed - step_size * mi / denom;
    // bf16 moments: the step above used the moments before rounding; one draw rounds both
    const std::uint32_t noise = S == Dtype::float32 ? 0u : noise_of(seed, i);
    m[i] = narrow(mi, noise, State{});
    v[i] = narrow(vi, noise >> 16, State{});
    master[i] = p;
    if constexpr (Write && O == Dtype::float32) static_cast<float*>(out)[i] = p;
    if constexpr (Write && O == Dtype::bfloat16) {
      static_cast<std::uint16_t*>(out)[i] = to_bfloat16(p);
    }
  }
}

template <Dtype S, Dtype G, bool Decoupled>
__attribute__((always_inline)) inline void with_decay(const AdamStep& s, const AdamTensors& t,
                                                      std::size_t begin, std::size_t end) {
  if (t.out == nullptr) return body<S, G, Decoupled, false, Dtype::float32>(s, t, begin, end);
  if (t.out_dtype == Dtype::bfloat16) {
    return body<S, G, Decoupled, true, Dtype::bfloat16>(s, t, begin, end);
  }
  body<S, G, Decoupled, true, Dtype::float32>(s, t, begin, end);
}

template <Dtype S, Dtype G>
__attribute__((always_inline)) inline void with_grad(const AdamStep& s, const AdamTensors& t,
                                                     std::size_t begin, std::size_t end) {
  if (s.decoupled) return with_decay<S, G, true>(s, t, begin, end);
  with_decay<S, G, false>(s, t, begin, end);
}

template <Dtype S>
__attribute__((always_inline)) inline void with_state(const AdamStep& s, const AdamTensors& t,
                                                      std::size_t begin, std::size_t end) {
  if (t.grad_dtype == Dtype::bfloat16) return with_grad<S, Dtype::bfloat16>(s, t, begin, end);
  with_grad<S, Dtype::float32>(s, t, begin, end);
}

__attribute__((always_inline)) inline void dispatch(const AdamStep& s, const AdamTensors& t,
                                                    std::size_t begin, std::size_t end) {
  if (t.state_dtype == Dtype::bfloat16) return with_state<Dtype::bfloat16>(s, t, begin, end);
  with_state<Dtype::float32>(s, t, begin, end);
}

void adam_baseline(const AdamStep& s, const AdamTensors& t, std::size_t begin, std::size_t end) {
  dispatch(s, t, begin, end);
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))) void adam_avx512(
    const AdamStep& s, const AdamTensors& t, std::size_t begin, std::size_t end) {
  dispatch(s, t, begin, end);
}

__attribute__((target("avx2,fma"))) void adam_avx2(const AdamStep& s, const AdamTensors& t,
                                                   std::size_t begin, std::size_t end) {
  dispatch(s, t, begin, end);
}

bool has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else  // elsewhere (aarch64: Grace) the baseline version, which the compiler vectorizes too
bool has_avx512() { return false; }
bool has_avx2() { return false; }
#endif
}  // namespace

std::vector<std::string> instruction_sets() {
  std::vector<std::string> sets;
  if (has_avx512()) sets.emplace_back("avx512");
  if (has_avx2()) sets.emplace_back("avx2");
  sets.emplace_back("baseline");
  return sets;
}

void adam_range(const std::string& isa, const AdamStep& step, const AdamTensors& tensors,
                std::size_t begin, std::size_t end) {
#if defined(__x86_64__) || defined(__i386__)
  if (isa == "avx512" && has_avx512()) return adam_avx512(step, tensors, begin, end);
  if (isa == "avx2" && has_avx2()) return adam_avx2(step, tensors, begin, end);
#endif
  if (isa == "baseline") return adam_baseline(step, tensors, begin, end);
  throw std::invalid_argument("instruction set '" + isa + "' is not one this CPU runs");
}

}  // namespace hpcmem::optim
