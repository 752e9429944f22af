// First-fit-decreasing bin packing with a max-segment-tree over the rows'
// free space: each example descends from the root to the leftmost row whose
// free space fits it. Every example could open its own row, so the tree has
// one leaf per example and unopened rows (all free) sit after opened ones.
#include "train/packing.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace lathe {

namespace {

class FreeSpaceTree {
 public:
  FreeSpaceTree(size_t n_rows, int32_t capacity) {
    while (leaves_ < n_rows) leaves_ *= 2;
    free_.assign(2 * leaves_, -1);
    for (size_t i = 0; i < n_rows; ++i) free_[leaves_ + i] = capacity;
    for (size_t i = leaves_ - 1; i >= 1; --i) free_[i] = std::max(free_[2 * i], free_[2 * i + 1]);
  }

  // Leftmost row with at least need free slots.
  size_t first_fit(int32_t need) const {
    LATHE_CHECK(free_[1] >= need, "packing: no row fits ", need, " tokens");
    size_t node = 1;
    while (node < leaves_) node = free_[2 * node] >= need ? 2 * node : 2 * node + 1;
    return node - leaves_;
  }

  void take(size_t row, int32_t n) {
    size_t node = leaves_ + row;
    free_[node] -= n;
    for (node /= 2; node >= 1; node /= 2) free_[node] = std::max(free_[2 * node], free_[2 * node + 1]);
  }

 private:
  size_t leaves_ = 1;
  std::vector<int32_t> free_;  // [2 * leaves_], heap order; free_[1] is the root
};

}  // namespace

std::vector<PackedRow> pack_first_fit_decreasing(std::span<const int32_t> lengths, int32_t capacity) {
  std::vector<int32_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return lengths[a] > lengths[b]; });
  FreeSpaceTree tree(lengths.size(), capacity);
  std::vector<PackedRow> rows;
  for (int32_t ex : order) {
    int32_t len = lengths[static_cast<size_t>(ex)];
    LATHE_CHECK(len >= 1 && len <= capacity, "packing: example ", ex, " has ", len, " tokens, capacity ", capacity);
    size_t row = tree.first_fit(len);
    tree.take(row, len);
    if (row == rows.size()) rows.emplace_back();
    rows[row].examples.push_back(ex);
    rows[row].n_tokens += len;
  }
  return rows;
}

std::vector<PackedRow> one_example_per_row(std::span<const int32_t> lengths) {
  std::vector<PackedRow> rows(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) rows[i] = {{static_cast<int32_t>(i)}, lengths[i]};
  return rows;
}

std::vector<int32_t> example_lengths(std::span<const Example> examples) {
  std::vector<int32_t> out;
  out.reserve(examples.size());
  for (const Example& e : examples) out.push_back(static_cast<int32_t>(e.input_ids.size()));
  return out;
}

double packing_fill(std::span<const PackedRow> rows, int32_t capacity) {
  if (rows.empty()) return 0.0;
  int64_t used = 0;
  for (const PackedRow& r : rows) used += r.n_tokens;
  return static_cast<double>(used) / (static_cast<double>(rows.size()) * capacity);
}

}  // namespace lathe
