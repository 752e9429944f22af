// The fp32 LoRA kernels (lora_ops.h) in a build without nvcc: every call
// reports that this build has no CUDA.
#include "backends/cuda/lora_ops.h"

namespace lathe::cuda {
namespace {
Status no_cuda() { return unsupported("cuda: this build of lathe has no CUDA backend (nvcc was not found at build time)"); }
}  // namespace

Status lora_split_weights(CudaContext&, const LoraSplitWeightsArgs&) { return no_cuda(); }
Status lora_sum_parts(CudaContext&, const LoraPartsArgs&) { return no_cuda(); }
Status lora_sum_parts_many(CudaContext&, const LoraPartsArgs*, int, bool) { return no_cuda(); }
Status lora_dropout_apply(CudaContext&, const LoraDropoutApplyArgs&) { return no_cuda(); }
Status lora_dropout_add(CudaContext&, const LoraDropoutAddArgs&) { return no_cuda(); }

}  // namespace lathe::cuda
