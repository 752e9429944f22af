// The GPU trainer tests' bf16 bounds (cuda_train_test.cpp's header argues
// them): for a case of a bf16_error*.json file ("full/llama", ...), a tensor
// ("loss" or a gradient's name) must be within kRunSpread × the largest of
// Hugging Face's bf16 errors of it (sdpa "error", eager "eager", and where
// the file has it the sdpa MATH backend's "math"), and the case's median of
// error / that largest error at most 1. A missing file, case or entry fails
// the test (its bound is then 0).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_train/fixture_util.h"

namespace lathe::testing {

// HF's largest run-to-run spread between its two bf16 runs, rounded up.
inline constexpr double kRunSpread = 2.0;

class HfBf16Bounds {
 public:
  HfBf16Bounds(const std::string& path, std::string name) : name_(std::move(name)) {
    try {
      std::ifstream f(path);
      if (!f) throw std::runtime_error("cannot open the file");
      case_ = nlohmann::json::parse(f).at("cases").at(name_);
    } catch (const std::exception& e) {
      ADD_FAILURE() << path << ": case " << name_ << ": " << e.what();
    }
  }
  // The largest of HF's bf16 errors of `tensor`; 0 (and a failure) if missing.
  double hf(const std::string& tensor) const {
    try {
      const nlohmann::json& e = tensor == "loss" ? case_.at("loss") : case_.at("grads").at(tensor);
      const double two = std::max(e.at("error").get<double>(), e.at("eager").get<double>());
      return e.contains("math") ? std::max(two, e.at("math").get<double>()) : two;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << name_ << ", " << tensor << ": " << e.what();
      return 0;
    }
  }
  double bound(const std::string& tensor) const { return kRunSpread * hf(tensor); }
  // Checks err against the bound and records err / HF's error for the median.
  void expect(const std::string& tensor, double err) {
    EXPECT_LE(err, bound(tensor)) << name_ << " " << tensor << " (HF's bf16 error " << hf(tensor) << ")";
    record(tensor, err);
  }
  void record(const std::string& tensor, double err) {
    const double h = hf(tensor);
    ratios_.push_back(h > 0 ? err / h : INFINITY);
  }
  double median() {
    if (ratios_.empty()) return INFINITY;
    std::sort(ratios_.begin(), ratios_.end());
    const size_t n = ratios_.size();
    return n % 2 ? ratios_[n / 2] : 0.5 * (ratios_[n / 2 - 1] + ratios_[n / 2]);
  }
  void expect_median() { EXPECT_LE(median(), 1.0) << name_ << ": median of error / HF's bf16 error"; }

 private:
  std::string name_;
  nlohmann::json case_ = nlohmann::json::object();
  std::vector<double> ratios_;
};

// One pass of mb on the CPU trainer and on its GPU copy: the GPU's loss and
// every gradient of the host's table checked with `check` (and the median),
// then forward_loss on the GPU giving the same loss and leaving the
// gradients as they were.
inline void expect_pass_matches_cpu(TrainableModel& host, CudaTrainableModel& gpu, const MicroBatch& mb,
                                    HfBf16Bounds& check) {
  const float scale = 1.0f / float(mb.n_supervised);
  auto lc = host.forward_backward(mb, scale);
  auto lg = gpu.forward_backward(mb, scale);
  ASSERT_TRUE(lc.is_ok() && lg.is_ok()) << lc.status().message() << lg.status().message();
  EXPECT_EQ(lg->n_supervised, lc->n_supervised);
  check.expect("loss", std::abs(lg->loss_sum - lc->loss_sum) / lc->loss_sum);
  std::vector<float> g = grads_of(gpu);
  for (const ParamInfo& p : host.param_table())
    check.expect(p.name, rel_error(g.data() + p.offset, host.grads().data() + p.offset, p.numel()));
  check.expect_median();
  auto lf = gpu.forward_loss(mb);
  ASSERT_TRUE(lf.is_ok()) << lf.status().message();
  EXPECT_DOUBLE_EQ(lf->loss_sum, lg->loss_sum);
  EXPECT_EQ(grads_of(gpu), g);
}

}  // namespace lathe::testing
