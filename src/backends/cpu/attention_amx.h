// Internal to the CPU backend: training attention over packed documents
// (ops/attention.h, AttentionVarlenArgs with bf16_products) on AMX tiles.
// The four products (S = Q·Kᵀ, O = P·V; backward dP = dO·Vᵀ, dV = Pᵀ·dO,
// dQ = dS·K, dK = dSᵀ·Q) take bf16 operands, rounded to nearest-even as
// they are packed, with f32 sums; scores, softmax, lse, the row dots and
// dS = P ⊙ (dP − rowdot) are f32 (exps within 2 ulp). Work is cut into
// tasks of one document and one head (backward: one kv head and its query
// heads) with 32-row query blocks; each task packs its K, V (and Q, dO) once.
//
// attention_amx_fits says whether a call can take this path (head_dim a
// multiple of 32 up to 256, no window shorter than the longest document);
// the entries assume it and validated args. AmxTiles::kEmulated runs the
// same code with the tile arithmetic in scalar code (tests, slow).
#pragma once

#include "backends/cpu/gemm_amx.h"
#include "ops/attention.h"

namespace lathe::cpu {

bool attention_amx_fits(int64_t head_dim, int window, int64_t longest);
void attention_varlen_forward_amx(const AttentionVarlenArgs& a, AmxTiles tiles);
void attention_varlen_backward_amx(const AttentionVarlenBackwardArgs& a, AmxTiles tiles);

}  // namespace lathe::cpu
