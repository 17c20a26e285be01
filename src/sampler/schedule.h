// The diffusion time grid and the number of tokens unmasked per step (Dream `_sample`, spec §3.3–3.4).
// All arithmetic is f32 exactly as the reference does it, so the per-step counts match bit for bit.
#pragma once

#include <cstdint>
#include <vector>

namespace dc {

// torch.linspace(1, eps, steps + 1) in f32: with n = steps + 1 and step = (eps − 1) / (n − 1),
// entry i is 1 + step·i for i < n/2 and eps − step·(n − 1 − i) otherwise (PyTorch's CPU formula;
// the first entry is exactly 1 and the last exactly eps). Precondition: steps >= 1.
std::vector<float> timesteps(int steps, float eps);

// Tokens to unmask per row in one step of the confidence-based algorithms:
// last_step ? int(avg_masked) : int(avg_masked · (1 − s/t)), f32 arithmetic, truncation toward zero.
// avg_masked is the batch-average masked count (f32); t = timesteps[i], s = timesteps[i + 1].
int64_t transfer_count(float avg_masked, float t, float s, bool last_step);

// The origin algorithm's per-position unmasking probability: 1 − s/t in f32, exactly 1 on the last step.
float origin_transfer_probability(float t, float s, bool last_step);

}  // namespace dc
