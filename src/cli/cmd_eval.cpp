// `lathe eval`: loss, perplexity, exact match and token F1 of a model (and,
// with --compare, of the same model without and with an adapter) on a data
// set. Flags in, library calls (train/evaluate.h, train/eval_report.h), table
// or JSON out. --device reads as generate's (auto: the GPU when there is one);
// the device that ran is named on stderr, under the table and in the report.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "io/tokenizer.h"
#include "models/causal_lm.h"
#include "train/dataset.h"
#include "train/eval_report.h"
#include "train/evaluate.h"
#include "train/text_codec.h"

namespace lathe::cli {
namespace {

struct EvalFlags {
  std::string model_dir;
  std::string adapter_dir;
  std::string data;
  bool compare = false;
  bool json = false;
  int max_new_tokens = 64;
  std::string report_dir;
  std::string metrics;
  std::string prompt_template = "{input} {output}";
  std::string label_key = "output";
  int seq_length = 2048;
  std::string device = "auto";
};

constexpr const char* kDescription =
    "Evaluate a model (optionally with a LoRA adapter) on a data set: loss (mean over supervised tokens), "
    "perplexity = exp(loss), and for {input, output} records exact match and token F1 of the greedy "
    "continuation of the prompt (up to EOS or --max-new-tokens) against the output.\n"
    "Answers are normalized before comparing: lowercased (Unicode-aware; scripts without case such as "
    "Korean are kept), punctuation removed (ASCII and Unicode punctuation), whitespace collapsed and "
    "trimmed. F1 is over whitespace tokens, as in SQuAD (articles are not removed).";

// A .jsonl file, or a NeMo-layout directory (its test.jsonl).
Result<std::string> data_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    if (!std::filesystem::exists(path, ec)) return not_found("eval: --data ", path, " does not exist");
    return path;
  }
  LATHE_ASSIGN_OR_RETURN(std::optional<std::string> test, find_split_file(path, Split::kTest));
  if (!test) return not_found("eval: ", path, " has no ", split_file_name(Split::kTest));
  return *test;
}

// One column on *device. With --device auto, a model the GPU cannot take
// (kUnsupported) runs on the CPU instead and *device says so from then on.
Result<EvalResult> eval_one(const EvalFlags& fl, const std::string& adapter, const std::vector<EvalRecord>& records,
                            const EvalOptions& opts, Device* device) {
  if (!device->is_cpu()) {
    auto gpu = cuda_eval_model({.model_dir = fl.model_dir, .adapter_dir = adapter, .device = device->index,
                                .max_new_tokens = opts.generate ? opts.max_new_tokens : 0},
                               records);
    if (gpu.is_ok()) return evaluate(**gpu, records, opts);
    if (fl.device != "auto" || gpu.status().code() != StatusCode::kUnsupported) return gpu.status();
    std::fprintf(stderr, "lathe eval: the GPU cannot run this model, using the CPU (%s)\n",
                 gpu.status().message().c_str());
    *device = Device::cpu();
  }
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model, CausalLM::load(fl.model_dir, {.adapter_dir = adapter}));
  return evaluate(*model, records, opts);
}

Status run_eval(const EvalFlags& fl) {
  if (fl.compare && fl.adapter_dir.empty()) return invalid_argument("eval: --compare needs --adapter");
  LATHE_ASSIGN_OR_RETURN(Device device, parse_device(fl.device));
  LATHE_ASSIGN_OR_RETURN(std::string file, data_file(fl.data));
  LATHE_ASSIGN_OR_RETURN(TextCodec codec, load_text_codec(fl.model_dir));
  LATHE_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(fl.model_dir));
  DataOptions data{.prompt_template = fl.prompt_template, .label_key = fl.label_key, .seq_length = fl.seq_length};
  int64_t n_dropped = 0;
  LATHE_ASSIGN_OR_RETURN(std::vector<EvalRecord> records, load_eval_records(file, data, codec, &n_dropped));
  if (n_dropped > 0) std::fprintf(stderr, "lathe eval: %lld records without a target skipped\n", (long long)n_dropped);
  LATHE_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(fl.model_dir + "/config.json"));
  EvalOptions opts{.max_new_tokens = fl.max_new_tokens,
                   .stop_ids = std::vector<int32_t>(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end()),
                   .generate = fl.max_new_tokens > 0,
                   .decode = [&tok](std::span<const int32_t> ids) { return tok.decode(ids, true); }};
  if (codec.eos_id) opts.stop_ids.push_back(*codec.eos_id);

  std::vector<EvalColumn> columns;
  if (fl.compare) {
    LATHE_ASSIGN_OR_RETURN(EvalResult base, eval_one(fl, "", records, opts, &device));
    columns.push_back({"base", std::move(base)});
  }
  LATHE_ASSIGN_OR_RETURN(EvalResult adapted, eval_one(fl, fl.adapter_dir, records, opts, &device));
  columns.push_back({fl.adapter_dir.empty() ? "model" : "adapted", std::move(adapted)});

  std::fprintf(stderr, "lathe eval: device %s\n", device.str().c_str());
  if (fl.json) {
    std::printf("%s\n", eval_columns_json(columns).c_str());
  } else {
    std::printf("%sdevice: %s\n", format_eval_table(columns).c_str(), device.str().c_str());
  }
  if (fl.report_dir.empty()) return Status::ok();
  std::optional<std::string> metrics = fl.metrics.empty() ? find_run_metrics(fl.adapter_dir) : fl.metrics;
  LATHE_TRY(write_eval_report(
      {.dir = fl.report_dir, .data_file = file, .metrics_path = metrics, .device = device.str()}, columns, records));
  if (!fl.json) std::printf("report: %s/report.md\n", fl.report_dir.c_str());
  return Status::ok();
}

}  // namespace

void add_eval(CLI::App& app, int* rc) {
  auto fl = std::make_shared<EvalFlags>();  // shared: CLI11 callbacks outlive this scope
  auto* cmd = app.add_subcommand("eval", kDescription);
  cmd->add_option("--model", fl->model_dir, "Model directory (config.json, weights, tokenizer)")->required();
  cmd->add_option("--adapter", fl->adapter_dir, "PEFT LoRA adapter directory, merged into the model");
  cmd->add_option("--data", fl->data, "JSONL file, or a NeMo-layout directory (its test.jsonl)")->required();
  cmd->add_flag("--compare", fl->compare, "Evaluate the base model and base + adapter side by side");
  cmd->add_flag("--json", fl->json, "Print JSON instead of a table");
  cmd->add_option("--max-new-tokens", fl->max_new_tokens, "Generation budget per record (0: loss only)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--report", fl->report_dir, "Write report.md (and loss_curves.svg) into this directory");
  cmd->add_option("--metrics", fl->metrics, "Training metrics.jsonl for the loss curves (default: next to the adapter)");
  cmd->add_option("--prompt-template", fl->prompt_template, "Prompt template of {input, output} records")
      ->capture_default_str();
  cmd->add_option("--label-key", fl->label_key, "The supervised field of the template")->capture_default_str();
  cmd->add_option("--seq-length", fl->seq_length, "Tokens per record; longer ones are cut")->capture_default_str();
  cmd->add_option("--device", fl->device,
                  "auto (a GPU when there is one and it can run the model, else the CPU), cpu, cuda or cuda:N; "
                  "the GPU runs the model in bf16")
      ->capture_default_str();
  cmd->callback([fl, rc] {
    EvalFlags f = *fl;
    *rc = report("eval", run_eval(f));
  });
}

}  // namespace lathe::cli
