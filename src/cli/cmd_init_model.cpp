// `lathe init-model`: writes a random-init Llama-family model in Hugging Face
// format (config.json, safetensors, generation_config.json, tokenizer files),
// from a preset or a config.json. By default the tokenizer is lathe's own
// byte-level BPE (io/tokenizer_builder.h); --tokenizer copies one instead.
// The config's bos/eos ids always come from the tokenizer written beside it.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "io/tokenizer_builder.h"
#include "models/random_init.h"

namespace lathe::cli {

namespace {

namespace fs = std::filesystem;

struct InitModelFlags {
  std::string preset;
  std::string config;
  std::string out;
  std::string tokenizer_dir;
  std::string dtype = "f32";
  uint64_t seed = 0;
  bool force = false;
};

ModelConfig llama_base(int vocab, int hidden, int ffn, int layers, int heads, int kv_heads) {
  ModelConfig c;
  c.model_type = "llama";
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = ffn;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  return c;
}

// vocab: the tokenizer's size, for presets that size themselves to it.
Result<ModelConfig> preset_config(const std::string& name, int32_t tokenizer_vocab) {
  if (name == "tiny") {
    int vocab = (tokenizer_vocab + 63) / 64 * 64;
    ModelConfig c = llama_base(vocab, 128, 384, 4, 4, 2);
    c.max_position_embeddings = 1024;
    c.tie_word_embeddings = true;
    return c;
  }
  if (name == "llama-3.2-1b" || name == "llama-3.1-8b") {
    bool small = name == "llama-3.2-1b";
    ModelConfig c = small ? llama_base(128256, 2048, 8192, 16, 32, 8) : llama_base(128256, 4096, 14336, 32, 32, 8);
    c.max_position_embeddings = 131072;
    c.tie_word_embeddings = small;
    c.rope_scaling = {.type = "llama3", .factor = small ? 32.0f : 8.0f, .low_freq_factor = 1.0f,
                      .high_freq_factor = 4.0f, .original_max_position_embeddings = 8192};
    return c;
  }
  return invalid_argument("unknown preset '", name, "' (choose tiny, llama-3.2-1b or llama-3.1-8b)");
}

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) return io_error("cannot write ", path.string());
  return Status::ok();
}

bool is_weight_file(const std::string& name) {
  return name.starts_with("model") && (name.ends_with(".safetensors") || name == "model.safetensors.index.json");
}

// Removes the weights of an earlier init-model run in dir (stale shards would
// otherwise shadow the new file). Weights init-model did not write are a real
// model: they stay, and the command fails, unless force.
Status clear_old_weights(const fs::path& dir, bool force) {
  std::vector<fs::path> old;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (!is_weight_file(name)) continue;
    if (!force && name.ends_with(".safetensors")) {
      auto f = SafetensorsFile::open(e.path().string());
      if (!f.is_ok() || f->metadata().count(kRandomInitMetadataKey) == 0)
        return invalid_argument(dir.string(), " holds a model that init-model did not write (", name,
                                "); pass --force to overwrite it");
    }
    old.push_back(e.path());
  }
  for (const fs::path& p : old) {
    std::error_code ec;
    fs::remove(p, ec);
    if (ec) return io_error("cannot remove ", p.string(), ": ", ec.message());
  }
  return Status::ok();
}

// Writes the tokenizer files into out and returns the tokenizer as loaded back.
Result<Tokenizer> write_tokenizer(const InitModelFlags& fl) {
  fs::path out(fl.out);
  if (fl.tokenizer_dir.empty()) {
    LATHE_ASSIGN_OR_RETURN(BuiltTokenizer built, build_byte_level_tokenizer(kDefaultTokenizerMerges));
    LATHE_TRY(write_text(out / "tokenizer.json", built.tokenizer_json));
    LATHE_TRY(write_text(out / "tokenizer_config.json", built.tokenizer_config_json));
  } else {
    fs::path src(fl.tokenizer_dir);
    if (!fs::exists(src / "tokenizer.json"))
      return not_found("--tokenizer: ", (src / "tokenizer.json").string(), " does not exist");
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
      if (!fs::exists(src / name)) continue;
      std::error_code ec;
      fs::copy_file(src / name, out / name, fs::copy_options::overwrite_existing, ec);
      if (ec) return io_error("cannot copy ", (src / name).string(), " to ", fl.out, ": ", ec.message());
    }
  }
  return Tokenizer::load(fl.out);
}

// bos/eos from the tokenizer: eos is its eos token plus <|eot_id|> when it has one.
void set_special_ids(const Tokenizer& tok, ModelConfig& cfg, GenerationConfig& gen) {
  cfg.bos_token_id = tok.bos_token_id().value_or(-1);
  cfg.eos_token_ids.clear();
  if (auto eos = tok.eos_token_id()) cfg.eos_token_ids.push_back(*eos);
  if (auto eot = tok.token_to_id("<|eot_id|>"); eot && (cfg.eos_token_ids.empty() || *eot != cfg.eos_token_ids[0]))
    cfg.eos_token_ids.push_back(*eot);
  gen.bos_token_id = cfg.bos_token_id;
  gen.eos_token_ids = cfg.eos_token_ids;
}

Status init_model(const InitModelFlags& fl) {
  auto dtype = dtype_from_name(fl.dtype);
  if (!dtype || (*dtype != DType::F32 && *dtype != DType::BF16))
    return invalid_argument("--dtype must be f32 or bf16, got '", fl.dtype, "'");
  fs::path out(fl.out);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return io_error("cannot create ", fl.out, ": ", ec.message());
  LATHE_TRY(clear_old_weights(out, fl.force));

  LATHE_ASSIGN_OR_RETURN(Tokenizer tok, write_tokenizer(fl));
  ModelConfig cfg;
  if (!fl.preset.empty()) {
    LATHE_ASSIGN_OR_RETURN(cfg, preset_config(fl.preset, tok.vocab_size()));
  } else {
    LATHE_ASSIGN_OR_RETURN(cfg, load_model_config(fl.config));
  }
  if (cfg.vocab_size < tok.vocab_size())
    return invalid_argument("the model's vocab_size ", cfg.vocab_size, " is smaller than the tokenizer's ",
                            tok.vocab_size(), " tokens");
  cfg.torch_dtype = *dtype == DType::BF16 ? "bfloat16" : "float32";
  GenerationConfig gen;  // Llama 3's sampling defaults
  gen.do_sample = true;
  gen.temperature = 0.6f;
  gen.top_p = 0.9f;
  set_special_ids(tok, cfg, gen);
  LATHE_TRY(cfg.validate());

  LATHE_TRY(write_text(out / "config.json", model_config_to_json(cfg)));
  LATHE_TRY(write_text(out / "generation_config.json", generation_config_to_json(gen)));
  // The tiny preset draws with std 0.2: with 0.02, its frozen tied embeddings
  // cap every logit near ±2.6, so LoRA could not push the loss under ~3.8.
  const float init_std = fl.preset == "tiny" ? 0.2f : 0.02f;
  LATHE_TRY(write_random_weights(fl.out, cfg, {.seed = fl.seed, .dtype = *dtype, .initializer_range = init_std}));
  int64_t n_params = 0;
  for (const TensorSpec& s : llama_tensor_specs(cfg)) n_params += s.shape.numel();
  std::printf("wrote %s: %s, %lld parameters (%s), vocab %d, tokenizer %d tokens\n", fl.out.c_str(),
              cfg.architecture.c_str(), static_cast<long long>(n_params), fl.dtype.c_str(), cfg.vocab_size,
              tok.vocab_size());
  return Status::ok();
}

}  // namespace

void add_init_model(CLI::App& app, int* rc) {
  auto fl = std::make_shared<InitModelFlags>();
  auto* cmd = app.add_subcommand("init-model", "Write a random-init Llama-family model in Hugging Face format");
  cmd->footer(
      "Presets: tiny (hidden 128, 4 layers, vocab sized to the tokenizer; for demos and tests),\n"
      "llama-3.2-1b and llama-3.1-8b (the real shapes). Weights: normal(0, 0.02) (tiny: 0.2), norms ones.\n"
      "Memory: one 5 GB shard at a time (llama-3.1-8b in bf16: 16 GB in 4 shards, 5.3 GB peak memory).");
  auto* preset = cmd->add_option("--preset", fl->preset, "Model preset: tiny, llama-3.2-1b, llama-3.1-8b");
  auto* config = cmd->add_option("--config", fl->config, "A config.json to take the model shape from");
  preset->excludes(config);
  cmd->add_option("--out", fl->out, "Directory to write the model into")->required();
  cmd->add_option("--seed", fl->seed, "Random seed (same seed, same weights)")->capture_default_str();
  cmd->add_option("--dtype", fl->dtype, "Weight dtype: f32 or bf16")->capture_default_str();
  cmd->add_option("--tokenizer", fl->tokenizer_dir,
                  "Copy tokenizer.json and tokenizer_config.json from this directory instead of "
                  "generating a byte-level BPE tokenizer");
  cmd->add_flag("--force", fl->force, "Overwrite weights in --out that init-model did not write");
  cmd->callback([fl, rc] {
    if (fl->preset.empty() && fl->config.empty()) {
      *rc = report("init-model", invalid_argument("pass --preset NAME or --config config.json"));
      return;
    }
    *rc = report("init-model", init_model(*fl));
  });
}

}  // namespace lathe::cli
