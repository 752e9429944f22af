// AdamW and gradient clipping against torch.optim.AdamW and
// torch.nn.utils.clip_grad_norm_ trajectories (tests/data/train/adamw.*, made by
// tools/make_adamw_fixtures.py), plus a naive double-precision twin for inputs
// large enough to cross chunk boundaries and threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "train/adamw.h"

namespace lathe {
namespace {

// fp32 agreement with torch, per element of a tensor t:
//   |ours - torch| <= kRelTol * |torch| + kScaleTol * max|torch over t|.
// The second term is about one fp32 ulp of the tensor's largest value: where
// m = lerp(m, g) cancels to near zero, a one-ulp difference in an input (the
// clip coefficient, say) is large relative to the tiny result but not to the
// terms that produced it.
constexpr double kRelTol = 1e-6;
constexpr double kScaleTol = 1e-7;

struct Fixture {
  nlohmann::json manifest;
  std::vector<float> data;
  std::vector<float> slice(int64_t off, int64_t n) const {
    return std::vector<float>(data.begin() + off, data.begin() + off + n);
  }
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture out;
    std::ifstream js(LATHE_TEST_DATA "/train/adamw.json");
    out.manifest = nlohmann::json::parse(js);
    std::ifstream bin(LATHE_TEST_DATA "/train/adamw.bin", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(bin)), std::istreambuf_iterator<char>());
    out.data.resize(bytes.size() / sizeof(float));
    std::memcpy(out.data.data(), bytes.data(), out.data.size() * sizeof(float));
    return out;
  }();
  return f;
}

double max_rel_error(const float* got, const std::vector<float>& want, double* worst_abs) {
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double bound = kRelTol * std::abs(static_cast<double>(want[i])) + kScaleTol * scale;
    worst = std::max(worst, err / bound);
    *worst_abs = std::max(*worst_abs, err);
  }
  return worst;  // <= 1 means within tolerance
}

void run_case(const nlohmann::json& c) {
  const Fixture& f = fixture();
  const auto& cfg = c["config"];
  AdamWConfig config{.beta1 = cfg["beta1"], .beta2 = cfg["beta2"], .eps = cfg["eps"],
                     .weight_decay = cfg["weight_decay"], .amsgrad = cfg["amsgrad"], .maximize = cfg["maximize"],
                     .no_decay_norm_and_bias = cfg["no_decay_norm_and_bias"]};
  const size_t n_params = c["params"].size();
  std::vector<std::vector<float>> params(n_params), grads(n_params);
  std::vector<AdamWParam> reg;
  for (size_t i = 0; i < n_params; ++i) {
    const auto& p = c["params"][i];
    const int64_t n = p["n"];
    params[i] = f.slice(p["init"], n);
    grads[i].assign(n, 0.0f);
    reg.push_back({.name = p["name"], .param = params[i].data(), .grad = grads[i].data(), .n = n});
  }
  auto opt = AdamW::create(config, std::move(reg));
  ASSERT_TRUE(opt.is_ok()) << opt.status().message();
  const double clip = c["clip_max_norm"];
  double worst = 0.0, worst_abs = 0.0;
  for (size_t s = 0; s < c["steps"].size(); ++s) {
    const auto& st = c["steps"][s];
    for (size_t i = 0; i < n_params; ++i) {  // copy in place: the optimizer holds the buffer
      const std::vector<float> g = f.slice(st["grads"][i], params[i].size());
      std::copy(g.begin(), g.end(), grads[i].begin());
    }
    if (clip > 0.0) {
      const double norm = opt->clip_grad_norm(clip);
      const double want = st["grad_norm"];
      EXPECT_NEAR(norm, want, kRelTol * want) << c["name"] << " step " << s;
    }
    opt->step(st["lr"].get<double>());
    for (size_t i = 0; i < n_params; ++i) {
      const double e = max_rel_error(params[i].data(), f.slice(st["params_after"][i], params[i].size()), &worst_abs);
      EXPECT_LE(e, 1.0) << c["name"] << " step " << s << " param " << c["params"][i]["name"];
      worst = std::max(worst, e);
    }
  }
  for (size_t i = 0; i < n_params; ++i) {
    const size_t n = params[i].size();
    EXPECT_LE(max_rel_error(opt->exp_avg(i).data(), f.slice(c["final"]["exp_avg"][i], n), &worst_abs), 1.0);
    EXPECT_LE(max_rel_error(opt->exp_avg_sq(i).data(), f.slice(c["final"]["exp_avg_sq"][i], n), &worst_abs), 1.0);
    if (config.amsgrad) {
      EXPECT_LE(max_rel_error(opt->max_exp_avg_sq(i).data(), f.slice(c["final"]["max_exp_avg_sq"][i], n),
                              &worst_abs), 1.0);
    }
  }
  EXPECT_EQ(opt->steps_taken(), static_cast<int64_t>(c["steps"].size()));
  std::printf("  %s: worst error %.3g of tolerance, worst abs %.3g\n",
              c["name"].get<std::string>().c_str(), worst, worst_abs);
}

TEST(AdamW, MatchesTorchOnEveryFixtureCase) {
  const auto& cases = fixture().manifest["cases"];
  ASSERT_GE(cases.size(), 5u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    run_case(c);
  }
}

// Naive twin: the same update, one element at a time, in double.
void naive_adamw(const AdamWConfig& c, double lr, int64_t t, float* p, const float* g, double* m, double* v) {
  const double bc1 = 1.0 - std::pow(c.beta1, t), bc2 = 1.0 - std::pow(c.beta2, t);
  const double gi = c.maximize ? -*g : *g;
  const double pd = *p * (1.0 - lr * c.weight_decay);
  *m = c.beta1 * *m + (1.0 - c.beta1) * gi;
  *v = c.beta2 * *v + (1.0 - c.beta2) * gi * gi;
  *p = static_cast<float>(pd - lr / bc1 * *m / (std::sqrt(*v) / std::sqrt(bc2) + c.eps));
}

TEST(AdamW, ChunkedThreadedUpdateMatchesNaiveTwinAcrossChunkBoundaries) {
  set_num_threads(2);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const std::vector<int64_t> sizes = {70001, 3, 40000, 0, 1};
  std::vector<std::vector<float>> p(sizes.size()), g(sizes.size()), p_ref;
  std::vector<AdamWParam> reg;
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (int64_t k = 0; k < sizes[i]; ++k) p[i].push_back(normal(rng));
    g[i].resize(sizes[i]);
    reg.push_back({.name = "w" + std::to_string(i), .param = p[i].data(), .grad = g[i].data(), .n = sizes[i]});
  }
  p_ref = p;
  const AdamWConfig cfg{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  auto opt = AdamW::create(cfg, std::move(reg));
  ASSERT_TRUE(opt.is_ok());
  std::vector<std::vector<double>> m(sizes.size()), v(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) m[i].assign(sizes[i], 0.0), v[i].assign(sizes[i], 0.0);
  for (int64_t t = 1; t <= 3; ++t) {
    for (auto& gi : g) for (float& x : gi) x = normal(rng);
    const double lr = 1e-2 / t;
    opt->step(lr);
    for (size_t i = 0; i < sizes.size(); ++i) {
      for (int64_t k = 0; k < sizes[i]; ++k) naive_adamw(cfg, lr, t, &p_ref[i][k], &g[i][k], &m[i][k], &v[i][k]);
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (int64_t k = 0; k < sizes[i]; ++k) {
      ASSERT_NEAR(p[i][k], p_ref[i][k], 1e-6 * std::abs(p_ref[i][k]) + 1e-7) << "tensor " << i << " elem " << k;
      ASSERT_NEAR(opt->exp_avg(i)[k], m[i][k], 1e-5 * std::abs(m[i][k]) + 1e-7);
      ASSERT_NEAR(opt->exp_avg_sq(i)[k], v[i][k], 1e-5 * std::abs(v[i][k]) + 1e-9);
    }
  }
  init_threads();
}

TEST(AdamW, NoDecayGroupSkipsNormsAndBiasesOnlyWhenAsked) {
  EXPECT_TRUE(is_no_decay_param("model.layers.3.input_layernorm.weight"));
  EXPECT_TRUE(is_no_decay_param("model.norm.weight"));
  EXPECT_TRUE(is_no_decay_param("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_TRUE(is_no_decay_param("lm_head.bias"));
  EXPECT_FALSE(is_no_decay_param("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(is_no_decay_param("model.layers.0.self_attn.q_proj.biased_thing"));
  for (bool grouped : {false, true}) {
    float w = 1.0f, b = 1.0f, gw = 0.0f, gb = 0.0f;
    auto opt = AdamW::create({.weight_decay = 0.5, .no_decay_norm_and_bias = grouped},
                             {{.name = "x.weight", .param = &w, .grad = &gw, .n = 1},
                              {.name = "x.bias", .param = &b, .grad = &gb, .n = 1}});
    ASSERT_TRUE(opt.is_ok());
    opt->step(0.1);  // zero gradient: only the decay moves the weights
    EXPECT_FLOAT_EQ(w, 0.95f);
    EXPECT_FLOAT_EQ(b, grouped ? 1.0f : 0.95f);
  }
}

TEST(AdamW, RejectsBadConfigAndParams) {
  float x = 0.0f;
  auto bad_beta = AdamW::create({.beta2 = 1.0}, {});
  ASSERT_FALSE(bad_beta.is_ok());
  EXPECT_NE(bad_beta.status().message().find("beta2"), std::string::npos);
  auto no_grad = AdamW::create({}, {{.name = "w", .param = &x, .grad = nullptr, .n = 1}});
  ASSERT_FALSE(no_grad.is_ok());
  EXPECT_NE(no_grad.status().message().find("'w'"), std::string::npos);
  auto twice = AdamW::create({}, {{.name = "w", .param = &x, .grad = &x, .n = 1},
                                  {.name = "w", .param = &x, .grad = &x, .n = 1}});
  ASSERT_FALSE(twice.is_ok());
  EXPECT_NE(twice.status().message().find("twice"), std::string::npos);
}

TEST(ClipGradNorm, ScalesOnlyAboveMaxAndLeavesNonFiniteAlone) {
  std::vector<float> a = {3.0f, 0.0f}, b = {4.0f};
  std::vector<std::span<float>> grads = {a, b};
  EXPECT_DOUBLE_EQ(clip_grad_norm(grads, 10.0), 5.0);  // below max: untouched
  EXPECT_EQ(a[0], 3.0f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(grads, 1.0), 5.0);  // returns the pre-clip norm
  const float coef = static_cast<float>(1.0 / (5.0 + 1e-6));
  EXPECT_FLOAT_EQ(a[0], 3.0f * coef);
  EXPECT_FLOAT_EQ(b[0], 4.0f * coef);
  std::vector<std::span<const float>> cgrads = {a, b};
  EXPECT_NEAR(global_grad_norm(cgrads), 1.0, 1e-6);
  b[0] = NAN;
  const float a0 = a[0];
  EXPECT_TRUE(std::isnan(clip_grad_norm(grads, 1.0)));
  EXPECT_EQ(a[0], a0);
}

}  // namespace
}  // namespace lathe
