// Element types and their conversions. bf16 and f16 are stored as raw 16-bit
// patterns; compute happens in f32. fp8 e4m3, int8 and nf4 are declared for
// quantized weights (nf4 packs two 4-bit codes per byte, so its element size
// is reported in bits).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace lathe {

enum class DType : uint8_t { F32, BF16, F16, FP8_E4M3, I8, NF4, F64, I64, I32, I16, U8, BOOL };

constexpr int dtype_bits(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 64;
    case DType::F32: case DType::I32: return 32;
    case DType::BF16: case DType::F16: case DType::I16: return 16;
    case DType::FP8_E4M3: case DType::I8: case DType::U8: case DType::BOOL: return 8;
    case DType::NF4: return 4;
  }
  return 0;
}
// Bytes for n elements (nf4 rounds up to whole bytes).
constexpr int64_t dtype_bytes(DType t, int64_t n) { return (n * dtype_bits(t) + 7) / 8; }

constexpr bool dtype_is_float(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64 || t == DType::FP8_E4M3;
}

// Names as lathe prints them: "f32", "bf16", ...
std::string_view dtype_name(DType t);
// safetensors names: "F32", "BF16", "F16", "F8_E4M3", "I8", "F64", "I64", "I32", "I16", "U8", "BOOL".
std::string_view dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_safetensors_name(std::string_view name);
std::optional<DType> dtype_from_name(std::string_view name);  // accepts both spellings

// --- scalar conversions -----------------------------------------------------

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of src (type st) into f32. st must be f32, bf16, f16 or f64.
void convert_to_f32(const void* src, DType st, float* dst, int64_t n);
// Converts n f32 values into dst of type dt (f32, bf16, f16).
void convert_from_f32(const float* src, void* dst, DType dt, int64_t n);

}  // namespace lathe
