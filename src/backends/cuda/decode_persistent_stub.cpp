// The persistent decode step in a build without nvcc: every call reports
// that this build has no CUDA, so callers need no #ifdef.
#include "backends/cuda/decode_persistent.h"

namespace lathe::cuda {

Status decode_persistent(CudaContext&, const PersistentDecodeArgs&, const GemvArgs*) {
  return unsupported("cuda: this build of lathe has no CUDA backend (nvcc was not found at build time)");
}
Status decode_persistent_prepare(int, int, int, int) {
  return unsupported("cuda: this build of lathe has no CUDA backend (nvcc was not found at build time)");
}
int decode_persistent_grid(int, int, int, int) { return 0; }
bool decode_persistent_supported(int, int) { return false; }

}  // namespace lathe::cuda
