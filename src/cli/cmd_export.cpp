// `lathe export --checkpoint LOC --target hf|hf-peft --out DIR`: a training
// checkpoint (local or s3://, a checkpoint directory or a checkpoints root,
// whose `last` is followed) written as a merged Hugging Face model or a PEFT
// adapter (train/export.h). The checkpoint must be committed and pass its
// checksums; its base model (recorded path, or --model) must hash as it did
// when training started, so an adapter is never merged into another model.
#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "io/storage.h"
#include "train/checkpoint.h"
#include "train/export.h"

namespace lathe::cli {
namespace {

struct ExportFlags {
  std::string checkpoint;
  std::string target;
  std::string out;
  std::string model_dir;  // overrides the checkpoint's base model path
  std::string dtype = "auto";
  uint64_t max_shard_bytes = 5'000'000'000ull;
};

// The tokenizer files the checkpoint carries (any of tokenizer_file_names()).
Result<std::vector<std::pair<std::string, std::string>>> checkpoint_tokenizer_files(const std::string& url) {
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Storage> st, open_existing_storage(url));
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& name : tokenizer_file_names()) {
    LATHE_ASSIGN_OR_RETURN(bool present, st->exists(name));
    if (!present) continue;
    LATHE_ASSIGN_OR_RETURN(std::string text, st->read_text(name));
    out.emplace_back(name, std::move(text));
  }
  return out;
}

Status check_base(const CheckpointInfo& info, const std::string& base_dir) {
  if (info.base_model_hash.empty()) return Status::ok();
  auto hash = base_model_hash(base_dir);
  if (!hash.is_ok())
    return not_found("the checkpoint's base model ", base_dir, " cannot be read (", hash.status().message(),
                     "); pass --model DIR with the model the run was trained on");
  if (*hash != info.base_model_hash)
    return invalid_argument("the base model ", base_dir, " (", *hash, ") is not the one ", info.location,
                            " was trained on (", info.base_model_hash, "); pass --model DIR with that model");
  return Status::ok();
}

Status run_export(const ExportFlags& fl) {
  if (fl.target != "hf" && fl.target != "hf-peft")
    return invalid_argument("--target must be hf or hf-peft, got '", fl.target, "'");
  HfExportOptions options{.max_shard_bytes = fl.max_shard_bytes};
  if (fl.dtype != "auto") {
    auto dt = dtype_from_name(fl.dtype);
    if (!dt || (*dt != DType::F32 && *dt != DType::BF16 && *dt != DType::F16))
      return invalid_argument("--dtype must be auto, float32, bfloat16 or float16, got '", fl.dtype, "'");
    options.dtype = *dt;
  }
  LATHE_ASSIGN_OR_RETURN(std::string url, resolve_checkpoint(fl.checkpoint));
  LATHE_ASSIGN_OR_RETURN(CheckpointInfo info, inspect_checkpoint(url));
  if (!info.committed)
    return invalid_argument(info.problem.empty() ? url + " is not committed" : info.problem,
                            "; export a committed one (lathe checkpoint list ROOT)");
  ExportSource src;
  src.base_model_dir = fl.model_dir.empty() ? info.base_model_path : fl.model_dir;
  if (src.base_model_dir.empty())
    return invalid_argument(url, " records no base model; pass --model DIR");
  LATHE_TRY(check_base(info, src.base_model_dir));
  src.full_sft = info.full_sft;
  src.lora = info.lora;
  LATHE_ASSIGN_OR_RETURN(src.tensors, load_checkpoint_model(url));
  LATHE_ASSIGN_OR_RETURN(src.tokenizer_files, checkpoint_tokenizer_files(url));
  if (fl.target == "hf") {
    LATHE_TRY(export_hf(src, fl.out, options));
  } else {
    LATHE_TRY(export_hf_peft(src, fl.out));
  }
  std::printf("exported %s (step %lld, %s) as %s to %s\n", url.c_str(), static_cast<long long>(info.step),
              info.full_sft ? "full SFT" : "LoRA", fl.target.c_str(), fl.out.c_str());
  return Status::ok();
}

}  // namespace

void add_export(CLI::App& app, int* rc) {
  auto fl = std::make_shared<ExportFlags>();  // shared: outlives this call, owned by the callback
  auto* cmd = app.add_subcommand("export", "Export a training checkpoint as a Hugging Face model or PEFT adapter");
  cmd->add_option("--checkpoint", fl->checkpoint,
                  "Checkpoint directory, or a checkpoints root (its `last` is used); local or s3://")
      ->required();
  cmd->add_option("--target", fl->target,
                  "hf: the merged model (W + scale·B·A), as transformers' save_pretrained writes it; "
                  "hf-peft: adapter_config.json + adapter_model.safetensors for peft")
      ->required();
  cmd->add_option("--out", fl->out, "Output directory (created)")->required();
  cmd->add_option("--model", fl->model_dir,
                  "Base model directory (default: the one the checkpoint records; its hash must match)");
  cmd->add_option("--dtype", fl->dtype, "hf: weight dtype, auto (the base model's), float32, bfloat16, float16")
      ->default_val("auto");
  cmd->add_option("--max-shard-bytes", fl->max_shard_bytes,
                  "hf: split model.safetensors into shards with an index past this many bytes")
      ->default_val(5'000'000'000ull);
  cmd->callback([fl, rc] { *rc = report("export", run_export(*fl)); });
}

}  // namespace lathe::cli
