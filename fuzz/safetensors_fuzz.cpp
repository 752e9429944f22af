// libFuzzer target: the safetensors header parser on arbitrary bytes. Every
// input must give a file or an error, never a crash or a sanitizer report;
// accepted files must hand out every tensor within the input.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/check.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto f = lathe::SafetensorsFile::from_bytes(bytes, "fuzz.safetensors");
  if (!f.is_ok()) return 0;
  for (const lathe::SafetensorsEntry& e : f->entries()) {
    auto t = f->tensor(e.name);
    LATHE_CHECK(t.is_ok(), "entry listed but not readable: ", e.name);
    LATHE_CHECK(static_cast<uint64_t>(t->nbytes()) == e.end - e.begin, "size mismatch for ", e.name);
    volatile uint8_t sink = 0;
    const auto* p = static_cast<const uint8_t*>(t->raw());
    for (int64_t i = 0; i < t->nbytes(); ++i) sink = sink ^ p[i];  // ASan checks the bounds
  }
  return 0;
}
