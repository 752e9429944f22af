#include "core/env.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

namespace lathe::env {

std::string get(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

Result<int64_t> get_int(const char* name, int64_t fallback, int64_t min_value, int64_t max_value) {
  std::string v = get(name);
  if (v.empty()) return fallback;
  errno = 0;
  char* end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0' || n < min_value || n > max_value)
    return invalid_argument("environment: ", name, "='", v, "' is not an integer in [", min_value, ", ",
                            max_value, "]");
  return static_cast<int64_t>(n);
}

std::string log_level() { return get("LATHE_LOG_LEVEL", "info"); }

std::string cpu_gemm() { return get("LATHE_CPU_GEMM"); }

std::string attn_bwd_kernels() { return get("LATHE_ATTN_BWD"); }

std::string attn_fwd_kernels() { return get("LATHE_ATTN_FWD"); }

Result<int64_t> attn_bwd_streams() { return get_int("LATHE_ATTN_BWD_STREAMS", 2, 1, 2); }

int64_t cuda_ce_chunk_rows() {
  const Result<int64_t> rows = get_int("LATHE_CUDA_CE_CHUNK_ROWS", 0, 0, 1 << 16);
  return rows.is_ok() ? *rows : 0;
}

std::string cuda_ce() { return get("LATHE_CUDA_CE"); }

int64_t cuda_ce_kept_kib() {
  const Result<int64_t> kib = get_int("LATHE_CUDA_CE_KEPT_KIB", -1, -1, 1 << 20);
  return kib.is_ok() ? *kib : -1;
}

Result<int64_t> cuda_lora_overlap() { return get_int("LATHE_CUDA_LORA_OVERLAP", 2, 0, 2); }

std::string cuda_lora_sums() { return get("LATHE_CUDA_LORA_SUMS"); }

Result<int64_t> cuda_decode_l2_prefetch_lag() { return get_int("LATHE_CUDA_DECODE_L2_PREFETCH_LAG", 1, -1, 64); }

Result<std::vector<int64_t>> cuda_decode_l2_prefetch() {
  const char* kName = "LATHE_CUDA_DECODE_L2_PREFETCH";
  const std::string v = get(kName);
  std::vector<int64_t> units;
  for (size_t at = 0; !v.empty() && at <= v.size();) {
    const size_t comma = std::min(v.find(',', at), v.size());
    const std::string item = v.substr(at, comma - at);
    errno = 0;
    char* end = nullptr;
    const long long n = std::strtoll(item.c_str(), &end, 10);
    if (errno != 0 || end == item.c_str() || *end != '\0' || n < 0 || n > 64)
      return invalid_argument("environment: ", kName, "='", v, "': '", item, "' is not an integer in [0, 64]");
    units.push_back(n);
    at = comma + 1;
  }
  if (units.empty()) units.push_back(-1);
  if (units.size() == 1) units.resize(5, units[0]);
  if (units.size() != 5)
    return invalid_argument("environment: ", kName, "='", v, "' holds ", units.size(), " counts (1 or 5: q|k|v, o, ",
                            "gate|up, down, LM head)");
  return units;
}

Result<int64_t> cuda_host_embedding() { return get_int("LATHE_CUDA_HOST_EMBED", 1, 0, 1); }

Result<int64_t> cuda_act_from_backward() { return get_int("LATHE_CUDA_ACT_FROM_BWD", 1, 0, 1); }

int checkpoint_write_delay_ms() {
  const int ms = std::atoi(get("LATHE_CHECKPOINT_WRITE_DELAY_MS", "0").c_str());
  return ms > 0 ? ms : 0;
}

int num_threads() {
  for (const char* name : {"LATHE_NUM_THREADS", "OMP_NUM_THREADS"}) {
    std::string v = get(name);
    if (!v.empty()) {
      int n = std::atoi(v.c_str());
      if (n > 0) return n;
    }
  }
  unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

std::string aws_endpoint_url() { return get("AWS_ENDPOINT_URL"); }

std::string aws_region() { return get("AWS_REGION", get("AWS_DEFAULT_REGION", "us-east-1")); }

Result<int64_t> s3_part_size_bytes() {
  LATHE_ASSIGN_OR_RETURN(int64_t mib, get_int("LATHE_S3_PART_SIZE_MB", 64, 5, 5120));
  return mib << 20;
}

Result<int64_t> s3_upload_concurrency() { return get_int("LATHE_S3_CONCURRENCY", 4, 1, 64); }

Result<int64_t> s3_max_attempts() { return get_int("LATHE_S3_MAX_ATTEMPTS", 8, 1, 100); }

Result<int64_t> s3_timeout_ms() { return get_int("LATHE_S3_TIMEOUT_MS", 30000, 100, 3600000); }

Result<int64_t> s3_backoff_ms() { return get_int("LATHE_S3_BACKOFF_MS", 200, 0, 60000); }

}  // namespace lathe::env
