// The PEFT gradient fixtures of tests/data/grad as lathe's batches, shared
// by the CPU trainer's tests: the fixture's right-padded batch as documents
// (labels shifted: labels[j] predicts token j + 1; positions restart per
// document), packed into one row; the tests' error metric; and the
// bf16-mixed bounds that trainable_model_test's Bf16Mixed derives.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "io/safetensors.h"
#include "train/trainable_model.h"

namespace lathe::testing {

struct Docs {
  std::vector<std::vector<int32_t>> ids, labels;
};

inline Docs read_docs(const SafetensorsFile& f) {
  Tensor ids = f.tensor("input_ids").value(), labels = f.tensor("labels").value(), lens = f.tensor("lengths").value();
  Docs d;
  const int64_t L = ids.size(1);
  for (int64_t b = 0; b < ids.size(0); ++b) {
    const int64_t n = lens.data<int64_t>()[b];
    std::vector<int32_t> x, y;
    for (int64_t j = 0; j < n; ++j) {
      x.push_back(int32_t(ids.data<int64_t>()[b * L + j]));
      y.push_back(j + 1 < n ? int32_t(labels.data<int64_t>()[b * L + j + 1]) : kIgnoreIndex);
    }
    d.ids.push_back(x);
    d.labels.push_back(y);
  }
  return d;
}

inline MicroBatch pack(const Docs& d, std::vector<size_t> which) {
  MicroBatch mb;
  mb.n_rows = 1;
  mb.cu_seqlens = {0};
  for (size_t i : which) {
    for (size_t j = 0; j < d.ids[i].size(); ++j) {
      mb.input_ids.push_back(d.ids[i][j]);
      mb.labels.push_back(d.labels[i][j]);
      mb.position_ids.push_back(int32_t(j));
      mb.n_supervised += d.labels[i][j] != kIgnoreIndex;
    }
    mb.cu_seqlens.push_back(int32_t(mb.input_ids.size()));
    mb.max_seqlen = std::max(mb.max_seqlen, int32_t(d.ids[i].size()));
  }
  mb.row_starts = {0, int32_t(mb.input_ids.size())};
  return mb;
}

// max|got − want| / max|want| (max|got − want| when want is all zero).
inline double rel_error(const float* got, const float* want, int64_t n) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - want[i]));
    ref = std::max(ref, std::abs(double(want[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

// bf16-mixed against f32 on the fixtures (see trainable_model_test's Bf16Mixed).
constexpr double kBf16LossTol = 2e-3, kBf16GradTol = 3e-2;

}  // namespace lathe::testing
