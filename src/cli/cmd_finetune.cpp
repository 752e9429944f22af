// `lathe finetune`: supervised fine-tuning (LoRA by default, full SFT with
// peft.peft_scheme=none) of a Hugging Face model directory on a JSONL data
// set. The recipe is the defaults, then --recipe FILE.yaml, then key=value
// overrides; --help lists every key with its type, default and doc. The run
// directory receives recipe.yaml, metrics.jsonl, loss_curves.svg and the
// adapter (or model); the summary goes to stdout, progress to stderr.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "train/recipe.h"
#include "train/trainer.h"

namespace lathe::cli {

namespace {

namespace fs = std::filesystem;

struct FinetuneFlags {
  std::string model;
  std::string data;
  std::string recipe;
  std::string run_dir;
  std::string adapter;
  std::string progress = "auto";
  std::string device = "auto";
  std::vector<std::string> overrides;
};

// runs/<UTC time>, with a suffix when that folder exists already.
std::string default_run_dir() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  std::string base = std::string("runs/") + stamp;
  std::string dir = base;
  for (int i = 2; fs::exists(dir); ++i) dir = base + "-" + std::to_string(i);
  return dir;
}

Result<ProgressStyle> parse_progress(const std::string& s) {
  if (s == "auto") return ProgressStyle::kAuto;
  if (s == "bar") return ProgressStyle::kBar;
  if (s == "lines") return ProgressStyle::kLines;
  return invalid_argument("--progress must be auto, bar or lines; got '", s, "'");
}

Status finetune(const FinetuneFlags& fl) {
  for (const std::string& o : fl.overrides) {
    if (o.find('=') == std::string::npos)
      return invalid_argument("'", o, "' is not a key=value override (e.g. trainer.max_steps=100)");
  }
  TrainerConfig config;
  LATHE_ASSIGN_OR_RETURN(config.recipe, load_recipe(fl.recipe, fl.overrides));
  LATHE_ASSIGN_OR_RETURN(config.progress, parse_progress(fl.progress));
  config.model_dir = fl.model;
  config.data_path = fl.data;
  config.adapter_dir = fl.adapter;
  config.device = fl.device;
  config.run_dir = fl.run_dir.empty() ? default_run_dir() : fl.run_dir;
  std::fprintf(stderr, "run directory: %s\n", config.run_dir.c_str());
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::create(config));
  LATHE_ASSIGN_OR_RETURN(TrainSummary summary, trainer->run());
  std::fputs(format_summary(summary).c_str(), stdout);
  std::fflush(stdout);
  return Status::ok();
}

}  // namespace

void add_finetune(CLI::App& app, int* rc) {
  auto fl = std::make_shared<FinetuneFlags>();
  auto* cmd = app.add_subcommand("finetune", "Fine-tune a model on a JSONL data set (LoRA by default)");
  cmd->footer(render_recipe_help());
  cmd->add_option("--model", fl->model, "Hugging Face model directory")->required();
  cmd->add_option("--data", fl->data,
                  "Data: a directory with training.jsonl (and validation.jsonl), or one JSONL file; "
                  "default: data.dataset_root");
  cmd->add_option("--recipe", fl->recipe, "YAML recipe applied over the defaults");
  cmd->add_option("--run-dir", fl->run_dir, "Where outputs go (default: a new folder under runs/)");
  cmd->add_option("--adapter", fl->adapter,
                  "Start LoRA from this PEFT adapter directory (adapter_config.json + adapter_model.safetensors); "
                  "its r, lora_alpha, use_rslora and target_modules replace the recipe's peft.* values");
  cmd->add_option("--progress", fl->progress, "Progress display: auto (a bar on a terminal), bar or lines")
      ->capture_default_str();
  cmd->add_option("--device", fl->device,
                  "cpu, cuda or cuda:N; auto: the GPU when one is present and the model suits it (LoRA, or "
                  "full SFT that fits its memory; head_dim 32/64/128), else the CPU")
      ->capture_default_str();
  cmd->add_option("overrides", fl->overrides, "key=value recipe overrides, e.g. peft.dim=16 trainer.max_steps=200");
  cmd->callback([fl, rc] { *rc = report("finetune", finetune(*fl)); });
}

}  // namespace lathe::cli
