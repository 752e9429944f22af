// The decode-step kernels in a build without nvcc: every call reports that
// this build has no CUDA, so callers need no #ifdef.
#include "backends/cuda/decode_ops.h"

namespace lathe::cuda {
namespace {
Status no_cuda() { return unsupported("cuda: this build of lathe has no CUDA backend (nvcc was not found at build time)"); }
}  // namespace

Status gemv(CudaContext&, const GemvArgs&) { return no_cuda(); }
bool gemv_supports(const bf16_bits*, const bf16_bits*, int64_t) { return false; }
bool gemv_fuses_pick(const GemvArgs&, int) { return false; }
GemvPrefetch gemv_l2_prefetch(const GemvArgs&, int, int) { return {}; }
std::vector<std::pair<int64_t, int64_t>> gemv_l2_prefetch_ranges(const GemvPrefetch&, int64_t, int64_t) { return {}; }
Status broadcast_rows(CudaContext&, bf16_bits*, const bf16_bits*, int64_t, int64_t) { return no_cuda(); }
Status embedding_f32(CudaContext&, const EmbeddingF32Args&) { return no_cuda(); }
Status decode_inputs(CudaContext&, const DecodeInputsArgs&) { return no_cuda(); }
Status residual_norm(CudaContext&, const ResidualNormArgs&) { return no_cuda(); }
Status rope_append(CudaContext&, const RopeAppendArgs&) { return no_cuda(); }
Status swiglu_rows(CudaContext&, const SwigluRowsArgs&) { return no_cuda(); }
Status attention_decode_batch_chunked(const AttentionDecodeBatchArgs&, int) { return no_cuda(); }
bool attention_decode_cluster_fits(const AttentionDecodeBatchArgs&) { return false; }
Status greedy_pick(CudaContext&, const GreedyPickArgs&) { return no_cuda(); }
Status sample_pick(CudaContext&, const SampleArgs&) { return no_cuda(); }
bool supports_overlap(int) { return false; }

}  // namespace lathe::cuda
