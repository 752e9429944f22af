// The attention kernels in a build without nvcc: every call reports that this
// build has no CUDA (the workspace sizes are still answered), so callers need
// no #ifdef.
#include "backends/cuda/attention.h"

namespace lathe::cuda {
namespace {
Status no_cuda() { return unsupported("cuda: this build of lathe has no CUDA backend (nvcc was not found at build time)"); }
}  // namespace

Status attention_varlen_forward(const AttentionVarlenFwdArgs&) { return no_cuda(); }
size_t attention_varlen_backward_workspace_bytes(int64_t n_tokens, int n_head, int head_dim, AttnBwdKernels kernels,
                                                 int64_t, int64_t, int64_t) {
  const size_t rows = size_t(n_tokens > 0 ? n_tokens : 0) * size_t(n_head > 0 ? n_head : 0);
  if (kernels != AttnBwdKernels::kFused) return rows * sizeof(float);
  const size_t section = (rows * sizeof(float) + 15) / 16 * 16;  // as attention_bwd.cu lays it out
  return 2 * section + rows * size_t(head_dim > 0 ? head_dim : 128) * sizeof(float);
}
Status attention_varlen_backward(const AttentionVarlenBwdArgs&) { return no_cuda(); }
Status attention_varlen_backward_delta(const AttentionVarlenBwdArgs&) { return no_cuda(); }
Status attention_wgmma_check(const AttentionWgmmaCheckArgs&) { return no_cuda(); }
size_t attention_decode_workspace_bytes(int n_tokens, int n_head, int head_dim) {
  if (n_tokens <= 0 || n_head <= 0 || head_dim <= 0) return 0;
  return size_t(n_tokens) * size_t(n_head) * 64 * size_t(head_dim + 2) * sizeof(float);
}
Status attention_decode(const AttentionDecodeArgs&) { return no_cuda(); }
Status attention_decode_batch(const AttentionDecodeBatchArgs&) { return no_cuda(); }

}  // namespace lathe::cuda
