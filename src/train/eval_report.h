// How evaluation results are shown: a plain-text table for the terminal,
// JSON for scripts, and a report directory (report.md with the table and the
// first records' predictions, loss_curves.svg from the training metrics).
// One column per evaluated model, so a base model and its adapted version sit
// side by side.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/evaluate.h"

namespace lathe {

struct EvalColumn {
  std::string name;  // "base", "adapted", or the model's name
  EvalResult result;
};

// Rows loss, perplexity, exact_match, f1, n_records; with two columns, a
// delta column (second − first).
std::string format_eval_table(const std::vector<EvalColumn>& columns);

// One column: eval_result_json. Several: {"<name>": {...}, ...}.
std::string eval_columns_json(const std::vector<EvalColumn>& columns);

struct EvalReportOptions {
  std::string dir;                  // created if missing
  std::string title = "Evaluation";
  std::string data_file;            // named in the report
  size_t max_records = 20;          // per-record predictions listed
  std::optional<std::string> metrics_path;  // training metrics.jsonl; none: no loss curves
  std::string device;               // what ran the model ("cpu", "cuda:0"); "": not named
};

// Writes dir/report.md and, with a metrics path, dir/loss_curves.svg.
// records: the evaluated records (prompts and references for the listing).
Status write_eval_report(const EvalReportOptions& options, const std::vector<EvalColumn>& columns,
                         const std::vector<EvalRecord>& records);

// The training run's metrics.jsonl next to an adapter: in adapter_dir, its
// parent (run/adapter) or grandparent (run/checkpoints/step-N); std::nullopt
// when none has one.
std::optional<std::string> find_run_metrics(const std::string& adapter_dir);

}  // namespace lathe
