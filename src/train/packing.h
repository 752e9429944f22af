// Sequence packing: whole examples placed into rows of seq_length token slots
// by first-fit-decreasing (longest first, each into the first row with room),
// so short fine-tuning examples stop wasting most of each row on padding.
// Packed examples never attend to each other and their positions restart at
// 0: the batcher turns each row into varlen documents with cu_seqlens.
//
// Packing runs once per data set, deterministically (ties broken by example
// index); the sampler shuffles rows, not examples, each epoch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "train/example.h"

namespace lathe {

struct PackedRow {
  std::vector<int32_t> examples;  // indices into the data set, in placement order
  int32_t n_tokens = 0;           // <= capacity
};

// lengths[i]: tokens of example i, each in [1, capacity]. O(n log n): a
// max-segment-tree over rows finds the first one with room.
std::vector<PackedRow> pack_first_fit_decreasing(std::span<const int32_t> lengths, int32_t capacity);

// Unpacked mode: one example per row.
std::vector<PackedRow> one_example_per_row(std::span<const int32_t> lengths);

std::vector<int32_t> example_lengths(std::span<const Example> examples);

// Fraction of the rows' token slots holding tokens (1.0 = no padding).
double packing_fill(std::span<const PackedRow> rows, int32_t capacity);

}  // namespace lathe
