// The generation kernels in a build without nvcc: every call reports that this
// build has no CUDA, so callers need no #ifdef.
#include <utility>

#include "backends/cuda/generation_ops.h"

namespace lathe::cuda {
namespace {
Status no_cuda() { return unsupported("cuda: this build of lathe has no CUDA backend (nvcc was not found at build time)"); }
}  // namespace

Status add_bias(CudaContext&, bf16_bits*, const bf16_bits*, int64_t, int64_t) { return no_cuda(); }
Status kv_append(CudaContext&, const KvAppendArgs&) { return no_cuda(); }
Status attention_simple(CudaContext&, const SimpleAttentionArgs&) { return no_cuda(); }
Status fill_random_bf16(CudaContext&, bf16_bits*, int64_t, uint64_t, float, float) { return no_cuda(); }

Result<CudaGraph> CudaGraph::capture(CudaContext&, const std::function<Status()>&) { return no_cuda(); }
CudaGraph::CudaGraph(CudaGraph&& o) noexcept
    : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)) {}
CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  std::swap(graph_, o.graph_);
  std::swap(exec_, o.exec_);
  return *this;
}
CudaGraph::~CudaGraph() = default;
Status CudaGraph::launch(CudaContext&) const { return no_cuda(); }

}  // namespace lathe::cuda
