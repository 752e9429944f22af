// The --device flag shared by the commands that run a model: which device a
// name means, and a clear error when the build or the machine lacks it.
#include <string>

#include "backends/cuda/device.h"
#include "cli/commands.h"

namespace lathe::cli {

Result<Device> parse_device(const std::string& flag) {
  const bool have_gpu = cuda::built_with_cuda() && cuda::device_count() > 0;
  if (flag == "auto") return have_gpu ? Device::cuda(0) : Device::cpu();
  if (flag == "cpu") return Device::cpu();
  int index = 0;
  if (flag != "cuda") {
    const std::string prefix = "cuda:";
    size_t used = 0;
    bool ok = flag.size() > prefix.size() && flag.compare(0, prefix.size(), prefix) == 0;
    if (ok) {
      try {
        index = std::stoi(flag.substr(prefix.size()), &used);
      } catch (const std::exception&) {
        ok = false;
      }
      ok = ok && used == flag.size() - prefix.size() && index >= 0;
    }
    if (!ok) return invalid_argument("--device: '", flag, "' is not a device (expected auto, cpu, cuda or cuda:N)");
  }
  if (!cuda::built_with_cuda())
    return unsupported("--device ", flag, ": this build of lathe has no CUDA backend (use --device cpu)");
  const int n = cuda::device_count();
  if (n == 0) return unsupported("--device ", flag, ": no CUDA device is visible (use --device cpu)");
  if (index >= n) return invalid_argument("--device ", flag, ": there are only ", n, " CUDA devices (0..", n - 1, ")");
  return Device::cuda(index);
}

}  // namespace lathe::cli
