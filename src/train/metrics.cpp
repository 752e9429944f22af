// metrics.jsonl writing and reading, and the terminal progress display (see
// metrics.h). nlohmann::json throws; every use is wrapped and turned into a Status.
#include "train/metrics.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace lathe {
namespace {

// JSON has no NaN or infinity: those become null (nlohmann's choice too, made
// explicit here so the reader can undo it).
nlohmann::json number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

Result<double> get_number(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) return invalid_argument("missing \"", key, "\"");
  if (it->is_null()) return std::nan("");
  if (!it->is_number()) return invalid_argument("\"", key, "\" is not a number");
  return it->get<double>();
}

Result<int64_t> get_int(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) return invalid_argument("missing \"", key, "\"");
  if (!it->is_number_integer()) return invalid_argument("\"", key, "\" is not an integer");
  return it->get<int64_t>();
}

Status parse_record(const nlohmann::json& obj, MetricsLog* log) {
  if (!obj.is_object()) return invalid_argument("not a JSON object");
  if (obj.contains("val_loss")) {
    ValMetrics v;
    LATHE_ASSIGN_OR_RETURN(v.step, get_int(obj, "step"));
    LATHE_ASSIGN_OR_RETURN(v.val_loss, get_number(obj, "val_loss"));
    LATHE_ASSIGN_OR_RETURN(v.perplexity, get_number(obj, "perplexity"));
    log->val.push_back(v);
    return Status::ok();
  }
  if (obj.contains("loss")) {
    StepMetrics s;
    LATHE_ASSIGN_OR_RETURN(s.step, get_int(obj, "step"));
    LATHE_ASSIGN_OR_RETURN(s.loss, get_number(obj, "loss"));
    LATHE_ASSIGN_OR_RETURN(s.lr, get_number(obj, "lr"));
    LATHE_ASSIGN_OR_RETURN(s.grad_norm, get_number(obj, "grad_norm"));
    LATHE_ASSIGN_OR_RETURN(s.tokens, get_int(obj, "tokens"));
    LATHE_ASSIGN_OR_RETURN(s.tokens_per_s, get_number(obj, "tokens_per_s"));
    log->train.push_back(s);
    return Status::ok();
  }
  return invalid_argument("neither a training record (\"loss\") nor a validation record (\"val_loss\")");
}

int terminal_width(std::FILE* f) {
  struct winsize ws {};
  if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20) return ws.ws_col;
  return 100;
}

std::string format_rate(double tokens_per_s) {
  char buf[32];
  if (!std::isfinite(tokens_per_s)) return "- tok/s";
  if (tokens_per_s >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM tok/s", tokens_per_s / 1e6);
  else if (tokens_per_s >= 1e4) std::snprintf(buf, sizeof buf, "%.1fk tok/s", tokens_per_s / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f tok/s", tokens_per_s);
  return buf;
}

}  // namespace

double perplexity_of(double loss) { return std::exp(loss); }

Result<MetricsWriter> MetricsWriter::open(const std::string& path, bool append) {
  std::FILE* f = std::fopen(path.c_str(), append ? "ab" : "wb");
  if (f == nullptr) return io_error("metrics: cannot open ", path, ": ", std::strerror(errno));
  MetricsWriter w;
  w.file_ = f;
  w.path_ = path;
  return w;
}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept : file_(other.file_), path_(std::move(other.path_)) {
  other.file_ = nullptr;
}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    if (file_ != nullptr) std::fclose(file_);
    file_ = other.file_;
    path_ = std::move(other.path_);
    other.file_ = nullptr;
  }
  return *this;
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

Status MetricsWriter::write_line(const std::string& line) {
  if (file_ == nullptr) return io_error("metrics: writer is closed");
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fputc('\n', file_) == EOF ||
      std::fflush(file_) != 0) {
    return io_error("metrics: cannot write ", path_, ": ", std::strerror(errno));
  }
  return Status::ok();
}

Status MetricsWriter::write(const StepMetrics& m) {
  nlohmann::json j;
  j["step"] = m.step;
  j["loss"] = number(m.loss);
  j["lr"] = number(m.lr);
  j["grad_norm"] = number(m.grad_norm);
  j["tokens"] = m.tokens;
  j["tokens_per_s"] = number(m.tokens_per_s);
  return write_line(j.dump());
}

Status MetricsWriter::write(const ValMetrics& m) {
  nlohmann::json j;
  j["step"] = m.step;
  j["val_loss"] = number(m.val_loss);
  j["perplexity"] = number(m.perplexity);
  return write_line(j.dump());
}

Result<MetricsLog> parse_metrics(std::string_view jsonl, std::string_view source) {
  MetricsLog log;
  size_t pos = 0;
  for (int64_t line_no = 1; pos < jsonl.size(); ++line_no) {
    const size_t nl = jsonl.find('\n', pos);
    const bool torn = nl == std::string_view::npos;
    const std::string_view line = jsonl.substr(pos, torn ? std::string_view::npos : nl - pos);
    pos = torn ? jsonl.size() : nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    Status s;
    try {
      s = parse_record(nlohmann::json::parse(line), &log);
    } catch (const nlohmann::json::exception& e) {
      s = invalid_argument("bad JSON: ", e.what());
    }
    if (!s.is_ok()) {
      if (torn) break;  // the writer died mid-line
      return s.with_context(std::string(source) + ":" + std::to_string(line_no));
    }
  }
  return log;
}

Result<MetricsLog> read_metrics(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("metrics: cannot open ", path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_metrics(text.str(), path);
}

// ---- Progress ------------------------------------------------------------

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  }
  return buf;
}

std::string format_progress_line(const StepMetrics& m, int64_t total_steps, double eta_s, bool with_bar, int width) {
  char head[64], stats[160];
  std::snprintf(head, sizeof head, "%lld/%lld", static_cast<long long>(m.step), static_cast<long long>(total_steps));
  std::snprintf(stats, sizeof stats, "loss %.4f | lr %.2e | %s | ETA %s", m.loss, m.lr,
                format_rate(m.tokens_per_s).c_str(), format_duration(eta_s).c_str());
  std::string text = std::string(head) + " | " + stats;
  if (!with_bar) return text.insert(0, "step ");
  // "[####......] " ahead of the text; at least 10 cells or no bar at all.
  const int cells = width - static_cast<int>(text.size()) - 3;
  if (cells < 10) return text.size() > static_cast<size_t>(width) ? text.substr(0, width) : text;
  const double frac = total_steps > 0 ? std::clamp(static_cast<double>(m.step) / total_steps, 0.0, 1.0) : 0.0;
  const int filled = static_cast<int>(frac * cells);
  std::string line = "[";
  line.append(filled, '#').append(cells - filled, '.').append("] ").append(text);
  return line;
}

ProgressBar::ProgressBar(ProgressOptions options) : opt_(options) {
  if (opt_.out == nullptr) opt_.out = stderr;
  if (opt_.print_every_n_steps < 1) opt_.print_every_n_steps = 1;
  bar_ = opt_.style == ProgressStyle::kBar || (opt_.style == ProgressStyle::kAuto && isatty(fileno(opt_.out)) == 1);
}

void ProgressBar::update(const StepMetrics& m) {
  const auto now = std::chrono::steady_clock::now();
  if (first_step_ < 0) {
    first_step_ = m.step;
    first_time_ = now;
  }
  // Rate from the first step seen, so a resumed run's ETA is honest; the
  // first step itself (compilation, warm caches) is the baseline.
  double eta = -1.0;
  const int64_t done = m.step - first_step_;
  if (done > 0) {
    const double per_step = std::chrono::duration<double>(now - first_time_).count() / static_cast<double>(done);
    eta = per_step * static_cast<double>(std::max<int64_t>(opt_.total_steps - m.step, 0));
  }
  if (bar_) {
    last_line_ = format_progress_line(m, opt_.total_steps, eta, true, terminal_width(opt_.out) - 1);
    std::fprintf(opt_.out, "\r%s\x1b[K", last_line_.c_str());
    drawn_ = true;
  } else if (m.step == first_step_ || m.step % opt_.print_every_n_steps == 0 || m.step == opt_.total_steps) {
    std::fprintf(opt_.out, "%s\n", format_progress_line(m, opt_.total_steps, eta, false, 0).c_str());
  }
  std::fflush(opt_.out);
}

void ProgressBar::message(std::string_view line) {
  if (bar_ && drawn_) {
    std::fprintf(opt_.out, "\r\x1b[K%.*s\n%s", static_cast<int>(line.size()), line.data(), last_line_.c_str());
  } else {
    std::fprintf(opt_.out, "%.*s\n", static_cast<int>(line.size()), line.data());
  }
  std::fflush(opt_.out);
}

void ProgressBar::finish() {
  if (bar_ && drawn_) std::fputc('\n', opt_.out);
  drawn_ = false;
  std::fflush(opt_.out);
}

}  // namespace lathe
