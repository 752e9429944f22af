// Every environment variable lathe reads, in one place: name, default, doc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe::env {

// LATHE_LOG_LEVEL: debug | info | warn | error | off. Default: info.
std::string log_level();
// LATHE_NUM_THREADS: CPU threads for compute. Default: OMP_NUM_THREADS, else all cores.
int num_threads();

// S3 storage (io/storage_s3.cpp). Credentials have no default:
//   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (optional).
// AWS_ENDPOINT_URL: an S3-compatible endpoint ("http://127.0.0.1:9000"),
// addressed path-style. Default: AWS itself, virtual-hosted.
std::string aws_endpoint_url();
// AWS_REGION, else AWS_DEFAULT_REGION. Default: us-east-1.
std::string aws_region();
// LATHE_S3_PART_SIZE_MB: multipart upload part size, MiB, 5..5120. Default: 64.
Result<int64_t> s3_part_size_bytes();
// LATHE_S3_CONCURRENCY: parts of one object uploaded at once, 1..64. Default: 4.
Result<int64_t> s3_upload_concurrency();
// LATHE_S3_MAX_ATTEMPTS: tries per S3 request, the first included, 1..100. Default: 8.
Result<int64_t> s3_max_attempts();
// LATHE_S3_TIMEOUT_MS: an S3 request fails when no byte moves for this long. Default: 30000.
Result<int64_t> s3_timeout_ms();
// LATHE_S3_BACKOFF_MS: first retry delay; doubles per try (full jitter, capped at 20 s). Default: 200.
Result<int64_t> s3_backoff_ms();
// LATHE_CHECKPOINT_WRITE_DELAY_MS: for tests only: milliseconds the checkpoint
// writer sleeps before each file it writes, so a test can kill a run
// mid-save deterministically. Default: 0.
int checkpoint_write_delay_ms();
// LATHE_CPU_GEMM: amx | avx512bf16 | f32 — the kernel for GEMMs with a bf16
// operand on the CPU (benchmarks, tests). Default: empty, the fastest the
// machine runs. An unknown value or one the machine cannot run falls back.
std::string cpu_gemm();
// LATHE_ATTN_BWD: mma | wgmma | fused | ws | ws-ds — the GPU attention backward's kernels
// where the caller leaves the choice open (cuda::AttnBwdKernels::kAuto).
// Default: empty, the compiled default. Another value: the backward fails
// naming the variable.
std::string attn_bwd_kernels();
// LATHE_ATTN_FWD: mma | wgmma | ws | ws-persistent — the GPU attention
// forward's kernel (training and prefill) where the caller leaves the
// choice open (cuda::AttnFwdKernels::kAuto); the Hopper ones where they run
// (head_dim 64 and 128), mma elsewhere; ws-persistent: the warp-specialized
// one with a block per SM. Default: empty, the compiled
// default. Another value: the forward fails naming the variable.
std::string attn_fwd_kernels();
// LATHE_ATTN_BWD_STREAMS: 2 (default) runs the GPU attention backward's dq
// kernel on a second stream beside dkdv; 1 runs them one after the other.
// Another value: an invalid-argument Status naming the variable.
Result<int64_t> attn_bwd_streams();
// LATHE_CUDA_CE_CHUNK_ROWS: rows per chunk of the GPU's fused LM head +
// cross-entropy (benchmarks). Default: 0, as many as ~512 MiB of bf16
// logits (or ~768 MiB of f32 logits and bf16 gradient) hold
// (cross_entropy.cu). Unreadable values count as 0.
int64_t cuda_ce_chunk_rows();
// LATHE_CUDA_CE: bf16 | f32 — the dtype the GPU's fused LM head writes its
// logits in where the caller leaves it open (cuda::CeLogits::kAuto). bf16
// is what a bf16 model's lm_head returns; its gradient then overwrites the
// logits in place. Default: empty, bf16. Another value: the call fails
// naming the variable.
std::string cuda_ce();
// LATHE_CUDA_CE_KEPT_KIB: KiB of each bf16 logit row the fused LM head's row
// kernel keeps in shared memory between its two passes (benchmarks; 0: none,
// the second pass reads the row again). Default: -1, 96 KiB (capped at what
// a block holds). Unreadable values count as -1.
int64_t cuda_ce_kept_kib();
// LATHE_CUDA_LORA_OVERLAP: 0 | 1 | 2 — the GPU LoRA trainer's backward runs
// the LoRA weight gradients (and the LoRA products only they read) on a
// second stream beside the main one: 0 no; 1 yes; 2 yes, that stream at the
// device's greatest priority (train/cuda_model_overlap.cpp). Results are
// bitwise the same in every mode. Default: 2. Another value: an
// invalid-argument Status naming the variable.
Result<int64_t> cuda_lora_overlap();
// LATHE_CUDA_LORA_SUMS: joined | separate — the GPU LoRA trainer's backward
// sums a group's dB and dA partial products in one launch after dA's GEMMs
// (joined), or dB's right after its GEMMs and dA's after theirs (separate;
// an A/B switch). The same bits either way. Default: empty, joined.
// Another value: the trainer fails naming the variable.
std::string cuda_lora_sums();
// LATHE_CUDA_DECODE_L2_PREFETCH: N, or five of them comma-separated, each
// 0..64 — units (8 weight rows × 2048 k) of each block of the next decode
// GEMV that a GEMV on the shared-memory ring pulls into L2
// (CudaModelOptions::l2_prefetch_units where left -1): every GEMV N, or
// q|k|v, o, gate|up, down and the LM head each its own; 0: none. Unset:
// five -1s, the default (CudaModelOptions::l2_prefetch_units). Another
// value: loading the model fails naming the variable. Returns the five
// counts.
Result<std::vector<int64_t>> cuda_decode_l2_prefetch();
// LATHE_CUDA_DECODE_L2_PREFETCH_LAG: -1..64 — when that prefetch goes out
// (GemvPrefetch::lag): -1, once the producer has issued its own copies; n,
// once the block's consumers have finished all but its last n units.
// Default: 1. Another value: loading the model fails naming the variable.
Result<int64_t> cuda_decode_l2_prefetch_lag();
// LATHE_CUDA_HOST_EMBED: 1 (default) | 0 — the GPU LoRA trainer keeps a
// frozen, untied embedding table in pinned host memory (the forward
// gathers the batch's rows over PCIe), which frees its device memory for
// activations; 0 keeps it on the device.
Result<int64_t> cuda_host_embedding();
// LATHE_CUDA_ACT_FROM_BWD: 1 (default) | 0 — the GPU LoRA trainer's
// backward of the down projection takes silu(gate)·up back from SwiGLU's
// backward (its LoRA gradients after dx) instead of rerunning SwiGLU's
// forward before it where the activation was not kept.
Result<int64_t> cuda_act_from_backward();

// Reads a variable; returns fallback when unset or empty.
std::string get(const char* name, const std::string& fallback = "");
// Reads an integer variable in [min_value, max_value]; fallback when unset or
// empty; an invalid-argument Status naming the variable otherwise.
Result<int64_t> get_int(const char* name, int64_t fallback, int64_t min_value, int64_t max_value);

}  // namespace lathe::env
