// `lathe checkpoint list ROOT` and `lathe checkpoint inspect CKPT`: what a
// checkpoints root (local or s3://) holds — step, metrics, size, committed or
// not, which one `last` names — as a table or, with --json, as JSON for
// scripts. inspect reads metadata only unless --verify, which also reads every
// file and checks its size and CRC32C.
#include <algorithm>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "train/checkpoint.h"

namespace lathe::cli {
namespace {

using json = nlohmann::ordered_json;

struct CheckpointFlags {
  std::string location;
  bool json = false;
  bool verify = false;
};

std::string human_bytes(int64_t n) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = double(n);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string metrics_text(const std::map<std::string, double>& metrics) {
  std::string s;
  for (const auto& [k, v] : metrics) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s=%.4f", s.empty() ? "" : " ", k.c_str(), v);
    s += buf;
  }
  return s.empty() ? "-" : s;
}

json info_json(const CheckpointInfo& c, bool is_last) {
  json j = {{"name", c.name},        {"location", c.location},       {"step", c.step},
            {"committed", c.committed}, {"last", is_last},           {"total_bytes", c.total_bytes},
            {"metrics", json(c.metrics)}};
  if (!c.problem.empty()) j["problem"] = c.problem;
  return j;
}

// The location `last` names under root, or "" when none is committed yet.
std::string last_location(const std::string& root) {
  auto r = resolve_checkpoint(root);
  return r.is_ok() ? *r : std::string();
}

Status run_list(const CheckpointFlags& fl) {
  LATHE_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, list_checkpoints(fl.location));
  const std::string last = last_location(fl.location);
  if (fl.json) {
    json arr = json::array();
    for (const CheckpointInfo& c : all) arr.push_back(info_json(c, c.location == last));
    std::printf("%s\n", arr.dump(2).c_str());
    return Status::ok();
  }
  if (all.empty()) {
    std::printf("no checkpoints under %s\n", fl.location.c_str());
    return Status::ok();
  }
  int width = 4;
  for (const CheckpointInfo& c : all) width = std::max(width, int(c.name.size()));
  std::printf("%-*s %8s %10s  %-10s  %s\n", width, "NAME", "STEP", "SIZE", "COMMITTED", "METRICS");
  for (const CheckpointInfo& c : all) {
    std::string committed = c.committed ? "yes" : "NO";
    if (c.location == last) committed += " (last)";
    std::printf("%-*s %8lld %10s  %-10s  %s\n", width, c.name.c_str(), static_cast<long long>(c.step),
                human_bytes(c.total_bytes).c_str(), committed.c_str(), metrics_text(c.metrics).c_str());
    if (!c.problem.empty()) std::printf("    %s\n", c.problem.c_str());
  }
  return Status::ok();
}

json details_json(const CheckpointInfo& c, bool is_last) {
  json j = info_json(c, is_last);
  j["format_version"] = c.format_version;
  j["world_size"] = c.world_size;
  j["kind"] = c.full_sft ? "full_sft" : "lora";
  if (!c.full_sft)
    j["lora"] = {{"r", c.lora.r}, {"alpha", c.lora.alpha}, {"dropout", c.lora.dropout},
                 {"rslora", c.lora.rslora}, {"target_modules", c.lora.target_modules}};
  j["base_model"] = {{"path", c.base_model_path}, {"hash", c.base_model_hash}};
  return j;
}

// Reads every file of a committed checkpoint and checks it against metadata.json.
Status verify(const std::string& url) {
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Storage> st, open_existing_storage(url));
  LATHE_ASSIGN_OR_RETURN(CheckpointMetadata m, read_committed_metadata(*st));
  return verify_checkpoint(*st, m);
}

Status run_inspect(const CheckpointFlags& fl) {
  LATHE_ASSIGN_OR_RETURN(std::string url, resolve_checkpoint(fl.location));
  LATHE_ASSIGN_OR_RETURN(CheckpointInfo c, inspect_checkpoint(url));
  const auto [root, name] = split_checkpoint_location(url);
  const bool is_last = last_location(root) == url;
  Status verified = fl.verify ? verify(url) : Status::ok();
  if (fl.json) {
    json j = details_json(c, is_last);
    if (fl.verify) j["verified"] = verified.is_ok();
    if (!verified.is_ok()) j["verify_error"] = verified.message();
    std::printf("%s\n", j.dump(2).c_str());
    return verified;
  }
  std::printf("checkpoint   %s%s\n", c.location.c_str(), is_last ? "  (last)" : "");
  std::printf("committed    %s%s\n", c.committed ? "yes" : "no", c.problem.empty() ? "" : ("  " + c.problem).c_str());
  std::printf("step         %lld\n", static_cast<long long>(c.step));
  std::printf("metrics      %s\n", metrics_text(c.metrics).c_str());
  std::printf("size         %s (%lld bytes)\n", human_bytes(c.total_bytes).c_str(),
              static_cast<long long>(c.total_bytes));
  std::printf("format       version %d, %d rank%s\n", c.format_version, c.world_size, c.world_size == 1 ? "" : "s");
  if (c.full_sft) {
    std::printf("training     full SFT\n");
  } else {
    std::string targets;
    for (const std::string& t : c.lora.target_modules) targets += (targets.empty() ? "" : ",") + t;
    std::printf("training     LoRA r=%d alpha=%g dropout=%g%s targets=%s\n", c.lora.r, double(c.lora.alpha),
                double(c.lora.dropout), c.lora.rslora ? " rslora" : "", targets.c_str());
  }
  std::printf("base model   %s (%s)\n", c.base_model_path.c_str(), c.base_model_hash.c_str());
  if (fl.verify && verified.is_ok()) std::printf("verified     every file's size and CRC32C match metadata.json\n");
  return verified;
}

}  // namespace

void add_checkpoint(CLI::App& app, int* rc) {
  auto* cmd = app.add_subcommand("checkpoint", "List and inspect training checkpoints (local or s3://)");
  cmd->require_subcommand(1);
  auto list = std::make_shared<CheckpointFlags>();  // shared: outlives this call, owned by the callback
  auto* l = cmd->add_subcommand("list", "Every checkpoint under a root: step, metrics, size, committed, last");
  l->add_option("root", list->location, "Checkpoints root, e.g. runs/x/checkpoints or s3://bucket/run/checkpoints")
      ->required();
  l->add_flag("--json", list->json, "Print a JSON array");
  l->callback([list, rc] { *rc = report("checkpoint list", run_list(*list)); });
  auto insp = std::make_shared<CheckpointFlags>();
  auto* i = cmd->add_subcommand("inspect", "One checkpoint in detail (a root means its `last`)");
  i->add_option("checkpoint", insp->location, "Checkpoint directory or root; local or s3://")->required();
  i->add_flag("--json", insp->json, "Print a JSON object");
  i->add_flag("--verify", insp->verify, "Also read every file and check its size and CRC32C");
  i->callback([insp, rc] { *rc = report("checkpoint inspect", run_inspect(*insp)); });
}

}  // namespace lathe::cli
