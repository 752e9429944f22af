// Internal to the CPU backend: the LM head fused with cross-entropy for a
// frozen bf16 head packed ahead (PackedBf16Weight), on AMX tiles: loss and
// (optionally) the hidden rows' gradient without the logits ever going to
// memory (cross_entropy_amx.cpp). cross_entropy() takes it where the bf16
// GEMM path is AMX and cross_entropy_amx_fits(dim).
#pragma once

#include <cstdint>

#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/gemm_bf16.h"

namespace lathe::cpu {

bool cross_entropy_amx_fits(int64_t dim);

// h [m, dim] f32 (the supervised rows), targets [m] in [0, vocab); loss[i]
// = lse − logit[target] of row i; dh [m, dim] = grad_scale · (softmax −
// onehot)·W, or null for the loss alone. head must be packed.
void cross_entropy_head_amx(const float* h, int64_t m, const int32_t* targets, float grad_scale,
                            const PackedBf16Weight& head, float* loss, float* dh, AmxTiles tiles = AmxTiles::kHardware);

}  // namespace lathe::cpu
