// Adam and AdamW over flat fp32 master weights, with the gradient read and the working
// weights written in the training's dtype and the two moments kept in fp32 or in bf16
// (rounded stochastically; see hpcmem/um/host_optimizer/kernel.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hpcmem::optim {

/// The element type of a gradient read, of working weights written, or of the moments.
enum class Dtype { float32, bfloat16 };

/// One step's hyperparameters, the bias corrections already folded in.
struct AdamStep {
  float beta2;
  float one_minus_beta1;      // computed in double, as PyTorch does, then rounded
  float one_minus_beta2;
  float eps;
  float step_size;            // lr / (1 - beta1^step)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float decay_factor;         // AdamW: 1 - lr * weight_decay
  float l2;                   // Adam: weight_decay, added to the gradient
  float sign;                 // -1 to maximize, else 1
  bool decoupled;             // AdamW's decay (true) or Adam's L2 term
  std::uint32_t seed;         // bf16 moments: the stochastic rounding's stream for this step
};

/// The tensors of one step: `count` elements each; `out` may be null.
struct AdamTensors {
  float* master;
  void* exp_avg;
  void* exp_avg_sq;
  Dtype state_dtype;
  const void* grad;
  Dtype grad_dtype;
  void* out;
  Dtype out_dtype;
};

/// Instruction sets this CPU can run the kernel with, best first ("baseline" always).
std::vector<std::string> instruction_sets();

/// Step elements [begin, end) with `isa` (one of instruction_sets()).
void adam_range(const std::string& isa, const AdamStep& step, const AdamTensors& tensors,
                std::size_t begin, std::size_t end);

}  // namespace hpcmem::optim
