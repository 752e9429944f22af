// CUDA attention kernels beside their floors. Training: forward and backward
// over packed documents of 2048 tokens, 32 query heads on 8 KV heads, head
// dim 128, 64 and 32, causal, in TFLOP/s of the causal attention FLOPs
// (forward 2 matmuls, backward counted as 2.5× forward, the usual
// convention; the kernels do more because the backward recomputes the
// scores) beside the ~810 TFLOP/s bf16 GEMM peak; each for the fast kernels
// and the simple ones they are checked against, and forward and backward in
// their Hopper (wgmma) builds where the device runs them (head_dim 64, 128),
// the warp-specialized Hopper forward in each of its shapes, and the
// one-kernel ("fused") backward.
// Decode: one token against a KV cache of n_ctx rows, in GB/s of K and V
// read (the floor is the device's copy bandwidth). Inputs are random bf16; timings are the median of runs
// after a warm-up, synchronizing the stream around each.
// Usage: bench_attention_cuda [documents, default 8] [decode n_ctx, default 8192]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "backends/cuda/attention.h"
#include "backends/cuda/device.h"
#include "core/dtype.h"

namespace {

using Clock = std::chrono::steady_clock;
using lathe::Status;
namespace cuda = lathe::cuda;

constexpr int kSeq = 2048, kHeads = 32, kKvHeads = 8, kDim = 128;
constexpr double kPeakTflops = 810.0;  // measured bf16 GEMM peak of the H200

cuda::DeviceBuffer random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> h(n);
  for (uint16_t& x : h) x = lathe::f32_to_bf16(dist(rng));
  cuda::DeviceBuffer b = std::move(cuda::DeviceBuffer::alloc(0, n * 2).value());
  (void)b.copy_from_host(h.data(), n * 2);
  return b;
}

// Median seconds of fn over `reps` runs after two warm-ups.
double time_it(const cuda::CudaStream& s, const std::function<Status()>& fn, int reps = 10) {
  std::vector<double> t;
  for (int i = 0; i < reps + 2; ++i) {
    const auto t0 = Clock::now();
    Status st = fn();
    if (st.is_ok()) st = s.synchronize();
    if (!st.is_ok()) {
      std::fprintf(stderr, "bench_attention_cuda: %s\n", st.message().c_str());
      std::exit(1);
    }
    if (i >= 2) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Forward and backward over `docs` packed documents at head_dim d for the
// fast kernels (16 and 32 query rows per warp in the forward; the backward
// has one fast version) and the simple ones: one printed line each.
void bench_training(const cuda::CudaStream& s, int docs, int d) {
  const int n = docs * kSeq;
  const size_t nq = size_t(n) * kHeads * d, nkv = size_t(n) * kKvHeads * d;
  cuda::DeviceBuffer q = random_bf16(nq, 1), k = random_bf16(nkv, 2), v = random_bf16(nkv, 3);
  cuda::DeviceBuffer d_out = random_bf16(nq, 4), out = random_bf16(nq, 5);
  cuda::DeviceBuffer dq = random_bf16(nq, 6), dk = random_bf16(nkv, 7), dv = random_bf16(nkv, 8);
  cuda::DeviceBuffer lse = std::move(cuda::DeviceBuffer::alloc(0, size_t(n) * kHeads * 4).value());
  const size_t ws_bytes =
      std::max(cuda::attention_varlen_backward_workspace_bytes(n, kHeads, d, cuda::AttnBwdKernels::kFused),
               cuda::attention_varlen_backward_workspace_bytes(n, kHeads, d, cuda::AttnBwdKernels::kWsDs, kSeq));
  cuda::DeviceBuffer ws = std::move(cuda::DeviceBuffer::alloc(0, ws_bytes).value());
  std::vector<int32_t> cu(size_t(docs) + 1);
  for (int i = 0; i <= docs; ++i) cu[size_t(i)] = i * kSeq;
  cuda::DeviceBuffer cu_dev = std::move(cuda::DeviceBuffer::alloc(0, cu.size() * 4).value());
  (void)cu_dev.copy_from_host(cu.data(), cu.size() * 4);
  const auto* cu_ptr = static_cast<const int32_t*>(cu_dev.data());
  const float scale = 1.0f / std::sqrt(float(d));
  // Causal: half of the S×S scores, 2 FLOPs per multiply-add, 2 matmuls.
  const double fwd_tflop = double(docs) * kHeads * 2.0 * 2.0 * kSeq * double(kSeq) / 2.0 * d * 1e-12;

  auto time_backward = [&](bool simple, cuda::AttnBwdKernels kernels, int wgmma_rows, bool load_store = false) {
    cuda::AttentionVarlenBwdArgs b{q.data(), k.data(), v.data(), out.data(), static_cast<const float*>(lse.data()),
                                   d_out.data(), dq.data(), dk.data(), dv.data(), cu_ptr, ws.data(), docs, kSeq, n,
                                   kHeads, kKvHeads, d, 0, scale, s.handle(), simple, kernels, wgmma_rows};
    b.fused_load_store = load_store, b.workspace_bytes = ws_bytes;
    const double t_bwd = time_it(s, [&] { return cuda::attention_varlen_backward(b); });
    const double bwd_rate = 2.5 * fwd_tflop / t_bwd;
    std::printf("  backward %7.3f ms %6.1f TFLOP/s (%4.1f%%)\n", t_bwd * 1e3, bwd_rate,
                100.0 * bwd_rate / kPeakTflops);
  };
  for (int warp_rows : {16, 32, 0}) {  // 0: the simple kernels
    const bool simple = warp_rows == 0;
    cuda::AttentionVarlenFwdArgs f{q.data(), k.data(), v.data(), out.data(), static_cast<float*>(lse.data()),
                                   cu_ptr, docs, kSeq, n, kHeads, kKvHeads, d, 0, scale, s.handle(), simple,
                                   warp_rows};
    const double t_fwd = time_it(s, [&] { return cuda::attention_varlen_forward(f); });
    const double fwd_rate = fwd_tflop / t_fwd;
    std::printf("  d=%-3d %-9s forward %7.3f ms %6.1f TFLOP/s (%4.1f%% of %.0f)", d,
                simple ? "simple" : warp_rows == 16 ? "fast w16" : "fast w32", t_fwd * 1e3, fwd_rate,
                100.0 * fwd_rate / kPeakTflops, kPeakTflops);
    if (warp_rows == 32) {  // the backward does not depend on it
      std::printf("\n");
      continue;
    }
    time_backward(simple, cuda::AttnBwdKernels::kMma, 0);
  }
  for (bool load_store : {false, true}) {  // the one-kernel backward (its forward is fast w32)
    std::printf("  d=%-3d %-9s %48s", d, load_store ? "fused l+s" : "fused red", "");
    time_backward(false, cuda::AttnBwdKernels::kFused, 0, load_store);
  }
  auto info = cuda::device_info(0);
  if (info.is_ok() && info.value().sm_major == 9 && (d == 64 || d == 128)) {
    for (int rows : {64, 128}) {  // one or two warpgroups per block
      cuda::AttentionVarlenFwdArgs f{q.data(), k.data(), v.data(), out.data(), static_cast<float*>(lse.data()),
                                     cu_ptr, docs, kSeq, n, kHeads, kKvHeads, d, 0, scale, s.handle(), false, 0,
                                     true, rows};
      const double t_fwd = time_it(s, [&] { return cuda::attention_varlen_forward(f); });
      const double fwd_rate = fwd_tflop / t_fwd;
      std::printf("  d=%-3d %-9s forward %7.3f ms %6.1f TFLOP/s (%4.1f%% of %.0f)", d,
                  rows == 64 ? "wgmma 64" : "wgmma 128", t_fwd * 1e3, fwd_rate, 100.0 * fwd_rate / kPeakTflops,
                  kPeakTflops);
      time_backward(false, cuda::AttnBwdKernels::kWgmma, rows);
    }
    // The warp-specialized backward (TMA producer, consumer warpgroups), d_q
    // in a kernel of its own (ws) or from the dS tiles dk/dv keeps (ws-ds).
    std::printf("  d=%-3d %-9s %48s", d, "ws", "");
    time_backward(false, cuda::AttnBwdKernels::kWs, 0);
    std::printf("  d=%-3d %-9s %48s", d, "ws-ds", "");
    time_backward(false, cuda::AttnBwdKernels::kWsDs, 0);
    // The warp-specialized forward: query rows per block × keys per tile, a
    // block per tile or (p) one per SM taking tiles in turn.
    const int shapes[4][2] = {{128, 64}, {128, 128}, {192, 64}, {192, 128}};
    for (int persistent : {0, 1})
      for (const auto& shape : shapes) {
        if (shape[0] == 192 && d != 64) continue;
        cuda::AttentionVarlenFwdArgs f{q.data(), k.data(), v.data(), out.data(), static_cast<float*>(lse.data()),
                                       cu_ptr, docs, kSeq, n, kHeads, kKvHeads, d, 0, scale, s.handle()};
        f.kernels = cuda::AttnFwdKernels::kWs, f.ws_rows = shape[0], f.ws_keys = shape[1];
        f.ws_persistent = persistent;
        const double t_fwd = time_it(s, [&] { return cuda::attention_varlen_forward(f); });
        const double fwd_rate = fwd_tflop / t_fwd;
        char name[24];
        std::snprintf(name, sizeof(name), "ws %dx%d%s", shape[0], shape[1], persistent ? "p" : "");
        std::printf("  d=%-3d %-9s forward %7.3f ms %6.1f TFLOP/s (%4.1f%% of %.0f)\n", d, name, t_fwd * 1e3,
                    fwd_rate, 100.0 * fwd_rate / kPeakTflops, kPeakTflops);
      }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (cuda::device_count() == 0) {
    std::printf("bench_attention_cuda: no CUDA device, nothing to measure\n");
    return 0;
  }
  const int docs = argc > 1 ? std::atoi(argv[1]) : 8;
  const int n_ctx = argc > 2 ? std::atoi(argv[2]) : 8192;
  cuda::CudaStream s = std::move(cuda::CudaStream::create(0).value());
  std::printf("attention training  docs=%d seq=%d heads=%d/%d causal (backward FLOPs = 2.5x forward)\n", docs, kSeq,
              kHeads, kKvHeads);
  for (int d : {128, 64, 32}) bench_training(s, docs, d);

  const float scale = 1.0f / std::sqrt(float(kDim));
  const size_t ncache = size_t(n_ctx) * kKvHeads * kDim;
  cuda::DeviceBuffer kc = random_bf16(ncache, 9), vc = random_bf16(ncache, 10), q1 = random_bf16(kHeads * kDim, 11);
  cuda::DeviceBuffer o1 = random_bf16(kHeads * kDim, 12);
  cuda::DeviceBuffer dws =
      std::move(cuda::DeviceBuffer::alloc(0, cuda::attention_decode_workspace_bytes(1, kHeads, kDim)).value());
  cuda::AttentionDecodeArgs d{q1.data(), kc.data(), vc.data(), o1.data(), nullptr, dws.data(), 1, n_ctx, kHeads,
                              kKvHeads, kDim, n_ctx - 1, 0, scale, s.handle()};
  const double t_dec = time_it(s, [&] { return cuda::attention_decode(d); }, 50);
  const double bytes = 2.0 * double(ncache) * 2.0;
  std::printf("attention decode    n_ctx=%d heads=%d/%d d=%d\n", n_ctx, kHeads, kKvHeads, kDim);
  std::printf("  one token %8.3f us  %7.1f GB/s of K+V (includes launch and sync)\n", t_dec * 1e6,
              bytes / t_dec * 1e-9);
  return 0;
}
