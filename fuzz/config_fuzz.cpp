// libFuzzer target: config.json and generation_config.json parsing on
// arbitrary bytes. Either parse succeeds with a config that validates and
// survives a write/parse round trip, or it fails with a Status.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/check.h"
#include "io/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto cfg = lathe::parse_model_config(text, "fuzz/config.json");
  if (cfg.is_ok()) {
    LATHE_CHECK(cfg->validate().is_ok(), "parsed config does not validate");
    auto back = lathe::parse_model_config(lathe::model_config_to_json(*cfg), "fuzz/written.json");
    LATHE_CHECK(back.is_ok(), "written config does not parse: ", back.status().message());
    LATHE_CHECK(back->hidden_size == cfg->hidden_size && back->head_dim == cfg->head_dim &&
                    back->rope_scaling.type == cfg->rope_scaling.type && back->eos_token_ids == cfg->eos_token_ids,
                "round trip changed the config");
  }
  auto gen = lathe::parse_generation_config(text, "fuzz/generation_config.json");
  if (gen.is_ok()) {
    auto back = lathe::parse_generation_config(lathe::generation_config_to_json(*gen), "fuzz/written.json");
    LATHE_CHECK(back.is_ok(), "written generation config does not parse: ", back.status().message());
  }
  return 0;
}
