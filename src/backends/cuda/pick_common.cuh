// What the two pick kernels (greedy_pick.cu, sample_pick.cu) share: the
// repetition penalty (decode_ops.h, SeenPenalty) as a device function, the
// feed's write of the pick, and the launchers' checks. Not part of the
// backend's interface.
#pragma once

#include <cstdint>

#include "backends/cuda/decode_ops.h"

namespace lathe::cuda {

// Logit v of token id in row r, penalized when the row's sequence holds id.
__device__ __forceinline__ float penalized(const SeenPenalty& p, int64_t r, int64_t id, float v) {
  if (!p.seen || p.penalty == 1.0f) return v;
  if (!((p.seen[r * p.stride + id / 32] >> (id % 32)) & 1u)) return v;
  return v < 0.0f ? v * p.penalty : v / p.penalty;
}

// A candidate of the greedy rule: the largest value wins, the lower column
// of equals; i < 0: none yet. NaN is never a candidate (pick_consider), so
// the winner does not depend on the order the candidates meet in.
struct PickBest {
  float v;
  int64_t i;
};
__device__ __forceinline__ bool pick_better(const PickBest& o, const PickBest& m) {
  return o.i >= 0 && (m.i < 0 || o.v > m.v || (o.v == m.v && o.i < m.i));
}
__device__ __forceinline__ void pick_consider(PickBest& b, float v, int64_t j) {
  if (v != v) return;  // NaN never wins
  if (pick_better({v, j}, b)) b = {v, j};
}
// The best of the lanes whose bits in `mask` differ (every lane of a group gets it).
__device__ __forceinline__ PickBest pick_shuffle(PickBest b, int mask) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    if (!(mask & off)) continue;
    const PickBest o{__shfl_xor_sync(0xffffffffu, b.v, off), __shfl_xor_sync(0xffffffffu, b.i, off)};
    if (pick_better(o, b)) b = o;
  }
  return b;
}

// Row r's pick `id` to next, and with a feed: the next step's token and
// position, and the host ring's slot of the position the row's token had.
__device__ __forceinline__ void write_pick(int32_t* next, const GreedyFeed& feed, int64_t r, int32_t id) {
  next[r] = id;
  if (!feed.tokens) return;
  const int32_t pos = feed.positions[r];
  feed.tokens[r] = id;
  feed.positions[r] = pos + 1;
  const int slot = ((pos % feed.ring_slots) + feed.ring_slots) % feed.ring_slots;
  feed.host_ring[r * feed.ring_slots + slot] = id;
}

// The checks both launchers make; messages start with `name`.
inline Status check_pick(const char* name, const float* logits, const int32_t* next, int64_t rows, int64_t vocab,
                         const GreedyFeed& feed) {
  if (rows < 0 || vocab <= 0 || rows > 65535) return invalid_argument(name, "bad shape ", rows, "x", vocab);
  if (!logits || !next) return invalid_argument(name, "null argument");
  if (feed.tokens && (!feed.positions || !feed.host_ring || feed.ring_slots <= 0))
    return invalid_argument(name, "a feed needs positions, a host ring and ring_slots > 0");
  return Status::ok();
}

}  // namespace lathe::cuda
