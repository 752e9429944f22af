// Training metrics: what a run reports and where it goes.
//   - metrics.jsonl: one JSON object per line, flushed per line so a crashed
//     or running job can be read (and plotted) at any time. A training step is
//     {step, loss, lr, grad_norm, tokens, tokens_per_s}; a validation is
//     {step, val_loss, perplexity}. Non-finite numbers are written as null.
//   - a progress display on stderr: one redrawn line with a bar when stderr is
//     a terminal, otherwise a plain line every few steps (logs stay readable).
//   - an SVG of the training and validation loss curves, drawn from a
//     metrics.jsonl with no outside tools (self-contained, opens in a browser).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

struct StepMetrics {
  int64_t step = 0;           // optimizer steps completed (1-based)
  double loss = 0.0;          // mean training loss of the step
  double lr = 0.0;            // learning rate the step used
  double grad_norm = 0.0;     // global gradient norm before clipping
  int64_t tokens = 0;         // loss tokens in the step's global batch
  double tokens_per_s = 0.0;  // throughput of the step
};

struct ValMetrics {
  int64_t step = 0;
  double val_loss = 0.0;
  double perplexity = 0.0;  // exp(val_loss)
};

struct MetricsLog {
  std::vector<StepMetrics> train;  // in file order
  std::vector<ValMetrics> val;
};

double perplexity_of(double loss);  // exp(loss); +inf on overflow

// Appends records to a metrics.jsonl. Move-only; owns its FILE. One thread.
class MetricsWriter {
 public:
  // append: keep existing records (a resumed run); otherwise truncate.
  static Result<MetricsWriter> open(const std::string& path, bool append = false);
  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  ~MetricsWriter();

  Status write(const StepMetrics& m);  // one line, flushed
  Status write(const ValMetrics& m);   // one line, flushed
  const std::string& path() const { return path_; }

 private:
  MetricsWriter() = default;
  Status write_line(const std::string& line);
  std::FILE* file_ = nullptr;
  std::string path_;
};

// Reads a metrics.jsonl. A torn last line (no newline: the writer was killed
// mid-write) is ignored; any other bad line is an error naming the line.
Result<MetricsLog> read_metrics(const std::string& path);
Result<MetricsLog> parse_metrics(std::string_view jsonl, std::string_view source);

// ---- Progress ------------------------------------------------------------
enum class ProgressStyle : uint8_t {
  kAuto,   // kBar when out is a terminal, else kLines
  kBar,    // one line redrawn in place
  kLines,  // a plain line every print_every_n_steps (and on the last step)
};

struct ProgressOptions {
  int64_t total_steps = 0;
  ProgressStyle style = ProgressStyle::kAuto;
  int64_t print_every_n_steps = 10;  // kLines only
  std::FILE* out = stderr;           // borrowed
};

// Shows training progress. Call from the training thread only.
class ProgressBar {
 public:
  explicit ProgressBar(ProgressOptions options);
  void update(const StepMetrics& m);
  // Prints a full line (a validation result, a checkpoint note) without
  // breaking the bar: the bar is redrawn under it.
  void message(std::string_view line);
  void finish();  // ends the bar's line; idempotent
  bool is_bar() const { return bar_; }

 private:
  ProgressOptions opt_;
  bool bar_ = false;
  bool drawn_ = false;
  std::string last_line_;
  int64_t first_step_ = -1;
  std::chrono::steady_clock::time_point first_time_;
};

// One progress line, at most width columns when with_bar (the bar shrinks to
// fit, and goes when there is no room). eta_s < 0: unknown.
std::string format_progress_line(const StepMetrics& m, int64_t total_steps, double eta_s, bool with_bar, int width);
std::string format_duration(double seconds);  // "00:42", "12:34", "1:02:03"

// ---- Loss curves ---------------------------------------------------------
struct LossPlotOptions {
  int width = 800;   // pixels
  int height = 450;
  std::string title = "Loss";
};

// An SVG with the training loss (polyline id "train-loss") and the validation
// loss (polyline id "val-loss", with point markers), axes, ticks and a legend.
// Non-finite values are left out.
std::string render_loss_svg(const MetricsLog& log, const LossPlotOptions& options = {});
// Reads metrics_path and writes the SVG to svg_path.
Status write_loss_svg(const std::string& metrics_path, const std::string& svg_path,
                      const LossPlotOptions& options = {});

}  // namespace lathe
