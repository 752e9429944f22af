#include "core/dtype.h"

#include "core/check.h"

namespace lathe {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::FP8_E4M3: return "fp8_e4m3";
    case DType::I8: return "i8";
    case DType::NF4: return "nf4";
    case DType::F64: return "f64";
    case DType::I64: return "i64";
    case DType::I32: return "i32";
    case DType::I16: return "i16";
    case DType::U8: return "u8";
    case DType::BOOL: return "bool";
  }
  return "?";
}

std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::FP8_E4M3: return "F8_E4M3";
    case DType::I8: return "I8";
    case DType::NF4: return "NF4";  // not a safetensors type; stored as U8 on disk
    case DType::F64: return "F64";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors_name(std::string_view n) {
  if (n == "F32") return DType::F32;
  if (n == "BF16") return DType::BF16;
  if (n == "F16") return DType::F16;
  if (n == "F8_E4M3") return DType::FP8_E4M3;
  if (n == "I8") return DType::I8;
  if (n == "F64") return DType::F64;
  if (n == "I64") return DType::I64;
  if (n == "I32") return DType::I32;
  if (n == "I16") return DType::I16;
  if (n == "U8") return DType::U8;
  if (n == "BOOL") return DType::BOOL;
  return std::nullopt;
}

std::optional<DType> dtype_from_name(std::string_view n) {
  if (auto t = dtype_from_safetensors_name(n)) return t;
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::FP8_E4M3, DType::I8, DType::NF4,
                  DType::F64, DType::I64, DType::I32, DType::I16, DType::U8, DType::BOOL}) {
    if (dtype_name(t) == n) return t;
  }
  if (n == "float32") return DType::F32;
  if (n == "bfloat16") return DType::BF16;
  if (n == "float16") return DType::F16;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (abs < 0x38800000u) {  // subnormal or zero in f16
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(e);  // value = m * 2^(e-150); f16 unit is 2^-24
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t h = ((abs - 0x38000000u) >> 13);
  uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

void convert_to_f32(const void* src, DType st, float* dst, int64_t n) {
  switch (st) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::F64: {
      auto* s = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    default:
      LATHE_CHECK(false, "convert_to_f32: unsupported source dtype ", dtype_name(st));
  }
}

void convert_from_f32(const float* src, void* dst, DType dt, int64_t n) {
  switch (dt) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    default:
      LATHE_CHECK(false, "convert_from_f32: unsupported destination dtype ", dtype_name(dt));
  }
}

}  // namespace lathe
