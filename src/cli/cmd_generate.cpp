// `lathe generate`: text generation from a Hugging Face model directory.
// Sampling defaults come from the model's generation_config.json (as
// transformers does: do_sample=false means greedy); flags override them.
// Text streams to stdout piece by piece; --json prints one object at the end
// with the exact generated ids instead. Timing goes to stderr.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "engine/generator.h"
#include "io/chat_template.h"
#include "io/hf_config.h"
#include "io/tokenizer.h"
#include "models/causal_lm.h"
#include "models/cuda_causal_lm.h"

namespace lathe::cli {

namespace {

constexpr int kDefaultMaxNewTokens = 256;

struct GenerateFlags {
  std::string model;
  std::string adapter;  // PEFT LoRA adapter directory, merged at load
  std::optional<std::string> prompt;
  std::optional<std::string> prompt_ids;
  bool chat = false;
  std::optional<std::string> system;
  std::optional<int> max_new_tokens;
  std::optional<float> temperature;
  std::optional<int> top_k;
  std::optional<float> top_p;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::vector<std::string> stop_token_ids;
  bool json = false;
  std::string device = "auto";
};

// "1,2,3" (and repeated flags) → ids. what names the flag in errors.
Result<std::vector<int32_t>> parse_ids(const std::vector<std::string>& parts, const char* what) {
  std::vector<int32_t> ids;
  for (const std::string& part : parts) {
    std::stringstream ss(part);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty()) continue;
      size_t used = 0;
      long long v = -1;
      try {
        v = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != item.size() || v < 0 || v > INT32_MAX)
        return invalid_argument(what, ": '", item, "' is not a token id (expected comma-separated integers >= 0)");
      ids.push_back(static_cast<int32_t>(v));
    }
  }
  return ids;
}

// Generation defaults from generation_config.json, then the flags on top.
SamplingOptions sampling_options(const GenerationConfig& gen, const GenerateFlags& fl) {
  SamplingOptions o;
  o.temperature = gen.do_sample ? gen.temperature : 0.0f;
  o.top_k = gen.top_k;
  o.top_p = gen.top_p;
  o.min_p = gen.min_p;
  o.repetition_penalty = gen.repetition_penalty;
  o.max_new_tokens = gen.max_new_tokens >= 0 ? gen.max_new_tokens : kDefaultMaxNewTokens;
  if (fl.temperature) o.temperature = *fl.temperature;
  if (fl.top_k) o.top_k = *fl.top_k;
  if (fl.top_p) o.top_p = *fl.top_p;
  if (fl.min_p) o.min_p = *fl.min_p;
  if (fl.repetition_penalty) o.repetition_penalty = *fl.repetition_penalty;
  if (fl.max_new_tokens) o.max_new_tokens = *fl.max_new_tokens;
  o.seed = fl.seed;
  o.stop_strings = fl.stop;
  return o;
}

Result<std::vector<int32_t>> prompt_tokens(const GenerateFlags& fl, const Tokenizer& tok) {
  if (fl.prompt_ids) {
    if (fl.chat) return invalid_argument("--chat needs --prompt text, not --prompt-ids");
    LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_ids({*fl.prompt_ids}, "--prompt-ids"));
    if (ids.empty()) return invalid_argument("--prompt-ids: no ids given");
    return ids;
  }
  if (!fl.chat) return tok.encode(*fl.prompt, /*add_special_tokens=*/true);
  LATHE_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::from_tokenizer_config(fl.model));
  nlohmann::json messages = nlohmann::json::array();
  if (fl.system) messages.push_back({{"role", "system"}, {"content", *fl.system}});
  messages.push_back({{"role", "user"}, {"content", *fl.prompt}});
  LATHE_ASSIGN_OR_RETURN(std::string text, tmpl.render(messages, /*add_generation_prompt=*/true));
  return tok.encode(text, /*add_special_tokens=*/false);  // the template writes its own bos
}

void print_json(const GenerationResult& r) {
  nlohmann::json j = {{"token_ids", r.token_ids},
                      {"text", r.text},
                      {"finish_reason", r.finish_reason},
                      {"prompt_tokens", r.prompt_tokens}};
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

// A CUDA model sized for this request: prompt + max_new_tokens, capped at the
// model's context.
Result<std::unique_ptr<CudaCausalLM>> load_cuda(const GenerateFlags& fl, Device device, int64_t wanted) {
  LATHE_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(fl.model));
  int64_t max_seq = std::max<int64_t>(wanted, 1);
  if (cfg.max_position_embeddings > 0) max_seq = std::min<int64_t>(max_seq, cfg.max_position_embeddings);
  return CudaCausalLM::load(fl.model, {.device = device.index, .max_seq = static_cast<int>(max_seq),
                                       .adapter_dir = fl.adapter});
}

Status run_generate(const GenerateFlags& fl) {
  LATHE_ASSIGN_OR_RETURN(Device device, parse_device(fl.device));
  if (!std::filesystem::is_directory(fl.model))
    return not_found("--model: ", fl.model, " is not a directory");
  LATHE_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(fl.model));
  LATHE_ASSIGN_OR_RETURN(GenerationConfig gen, load_generation_config(fl.model));
  LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, prompt_tokens(fl, tok));
  SamplingOptions opts = sampling_options(gen, fl);
  std::unique_ptr<CausalLM> model;
  std::unique_ptr<CudaCausalLM> cuda_model;
  if (device.is_cpu()) {
    LATHE_ASSIGN_OR_RETURN(model, CausalLM::load(fl.model, {.adapter_dir = fl.adapter}));
  } else {
    LATHE_ASSIGN_OR_RETURN(cuda_model, load_cuda(fl, device, int64_t(prompt.size()) + opts.max_new_tokens));
  }
  const ModelConfig& cfg = model ? model->config() : cuda_model->config();
  if (!fl.stop_token_ids.empty()) {
    LATHE_ASSIGN_OR_RETURN(opts.stop_token_ids, parse_ids(fl.stop_token_ids, "--stop-token-ids"));
  } else {
    opts.stop_token_ids = default_stop_token_ids(gen, cfg, tok);
  }
  TextCallback stream;
  if (!fl.json) {
    stream = [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
  }
  LATHE_ASSIGN_OR_RETURN(GenerationResult r, model ? generate(*model, tok, prompt, opts, stream)
                                                     : generate(*cuda_model, tok, prompt, opts, stream));
  if (fl.json) {
    print_json(r);
  } else {
    std::printf("\n");
  }
  std::fflush(stdout);  // the text ends its line before the summary on stderr
  std::fprintf(stderr, "prompt: %d tokens, prefill %.1f tokens/s; generated: %zu tokens, decode %.1f tokens/s; finish: %s\n",
               r.prompt_tokens, r.prefill_tokens_per_s(), r.token_ids.size(), r.decode_tokens_per_s(),
               r.finish_reason.c_str());
  return Status::ok();
}

}  // namespace

void add_generate(CLI::App& app, int* rc) {
  auto fl = std::make_shared<GenerateFlags>();
  auto* cmd = app.add_subcommand("generate", "Generate text from a model directory");
  cmd->footer("Sampling defaults come from the model's generation_config.json; flags override them.\n"
              "--temperature 0 is greedy decoding.");
  cmd->add_option("--model", fl->model, "Model directory (config.json, safetensors, tokenizer files)")->required();
  cmd->add_option("--adapter", fl->adapter, "PEFT LoRA adapter directory, merged into the model at load");
  auto* prompt = cmd->add_option("--prompt", fl->prompt, "Prompt text");
  auto* ids = cmd->add_option("--prompt-ids", fl->prompt_ids, "Prompt as token ids: 1,2,3");
  prompt->excludes(ids);
  cmd->add_flag("--chat", fl->chat, "Render the prompt as one user message with the chat template");
  cmd->add_option("--system", fl->system, "System message (with --chat)");
  cmd->add_option("--max-new-tokens", fl->max_new_tokens, "Most tokens to generate (default: generation_config, else 256)");
  cmd->add_option("--temperature", fl->temperature, "Sampling temperature; 0 is greedy");
  cmd->add_option("--top-k", fl->top_k, "Keep the k most likely tokens (0: off)");
  cmd->add_option("--top-p", fl->top_p, "Keep the smallest set with this much probability (1: off)");
  cmd->add_option("--min-p", fl->min_p, "Drop tokens below min_p times the top probability (0: off)");
  cmd->add_option("--repetition-penalty", fl->repetition_penalty, "Penalty for tokens already seen (1: off)");
  cmd->add_option("--seed", fl->seed, "Random seed")->capture_default_str();
  cmd->add_option("--stop", fl->stop, "Stop before this text (repeatable)");
  cmd->add_option("--stop-token-ids", fl->stop_token_ids,
                  "Token ids that end generation, e.g. 128001,128009 (replaces the eos ids from the model)");
  cmd->add_flag("--json", fl->json, "Print one JSON object: token_ids, text, finish_reason, prompt_tokens");
  cmd->add_option("--device", fl->device, "auto (a GPU when there is one), cpu, cuda or cuda:N")->capture_default_str();
  cmd->callback([fl, rc] {
    if (!fl->prompt && !fl->prompt_ids) {
      *rc = report("generate", invalid_argument("pass --prompt TEXT or --prompt-ids 1,2,3"));
      return;
    }
    if (fl->system && !fl->chat) {
      *rc = report("generate", invalid_argument("--system needs --chat"));
      return;
    }
    *rc = report("generate", run_generate(*fl));
  });
}

}  // namespace lathe::cli
