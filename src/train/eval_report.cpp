// Evaluation tables, JSON and the report directory. Numbers print with four
// decimals (perplexity with two); metrics a column lacks (no generated
// record) print as "-" in tables and null in JSON.
#include "train/eval_report.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "train/metrics.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

struct Row {
  const char* name;
  int decimals;
  std::optional<double> (*get)(const EvalResult&);
};

const Row kRows[] = {
    {"loss", 4, [](const EvalResult& r) { return std::optional<double>(r.loss); }},
    {"perplexity", 2, [](const EvalResult& r) { return std::optional<double>(r.perplexity); }},
    {"exact_match", 4, [](const EvalResult& r) { return r.exact_match; }},
    {"f1", 4, [](const EvalResult& r) { return r.f1; }},
    {"n_records", 0, [](const EvalResult& r) { return std::optional<double>(double(r.n_records)); }},
};

std::string fmt(std::optional<double> v, int decimals, bool sign = false) {
  if (!v) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, sign ? "%+.*f" : "%.*f", decimals, *v);
  return buf;
}

// Cells of a row: its name, one value per column, and the delta of two columns.
std::vector<std::string> row_cells(const Row& row, const std::vector<EvalColumn>& columns) {
  std::vector<std::string> cells = {row.name};
  for (const EvalColumn& c : columns) cells.push_back(fmt(row.get(c.result), row.decimals));
  if (columns.size() == 2) {
    auto a = row.get(columns[0].result), b = row.get(columns[1].result);
    bool has = a && b && std::isfinite(*a) && std::isfinite(*b) && std::string(row.name) != "n_records";
    cells.push_back(has ? fmt(*b - *a, row.decimals, true) : "");
  }
  return cells;
}

std::vector<std::string> header_cells(const std::vector<EvalColumn>& columns) {
  std::vector<std::string> h = {"metric"};
  for (const EvalColumn& c : columns) h.push_back(c.name);
  if (columns.size() == 2) h.push_back("delta");
  return h;
}

// One table cell of free text: one line, pipes escaped, cut to max_chars
// code points.
std::string md_cell(const std::string& text, size_t max_chars = 120) {
  std::string out;
  size_t n_chars = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80 && ++n_chars > max_chars) {
      out += "…";
      break;
    }
    if (c == '\n') out += "\\n";
    else if (c == '\r') continue;
    else if (c == '|') out += "\\|";
    else out.push_back(char(c));
  }
  return out;
}

std::string md_row(const std::vector<std::string>& cells) {
  std::string s = "|";
  for (const std::string& c : cells) s += " " + c + " |";
  return s + "\n";
}

std::string md_table(const std::vector<EvalColumn>& columns) {
  std::vector<std::string> h = header_cells(columns);
  std::string s = md_row(h);
  s += md_row(std::vector<std::string>(h.size(), "---"));
  for (const Row& row : kRows) s += md_row(row_cells(row, columns));
  return s;
}

std::string md_predictions(const std::vector<EvalColumn>& columns, const std::vector<EvalRecord>& records,
                           size_t max_records) {
  std::vector<std::string> h = {"#", "prompt", "reference"};
  for (const EvalColumn& c : columns) {
    h.push_back(c.name + " prediction");
    h.push_back(c.name + " EM");
    h.push_back(c.name + " F1");
  }
  std::string s = md_row(h) + md_row(std::vector<std::string>(h.size(), "---"));
  size_t listed = 0;
  for (size_t i = 0; i < records.size() && listed < max_records; ++i) {
    if (!records[i].reference) continue;
    std::vector<std::string> cells = {std::to_string(i + 1), md_cell(records[i].prompt_text),
                                      md_cell(*records[i].reference)};
    for (const EvalColumn& c : columns) {
      const RecordResult& r = c.result.records.at(i);
      cells.push_back(r.prediction ? md_cell(*r.prediction) : "-");
      cells.push_back(r.prediction ? fmt(r.exact_match, 0) : "-");
      cells.push_back(r.prediction ? fmt(r.f1, 2) : "-");
    }
    s += md_row(cells);
    ++listed;
  }
  return listed == 0 ? "No {input, output} records were generated.\n" : s;
}

Status write_file(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) return io_error("eval report: cannot write ", path.string());
  f << text;
  f.close();
  if (!f) return io_error("eval report: writing ", path.string(), " failed");
  return Status::ok();
}

}  // namespace

std::string format_eval_table(const std::vector<EvalColumn>& columns) {
  std::vector<std::vector<std::string>> rows = {header_cells(columns)};
  for (const Row& row : kRows) rows.push_back(row_cells(row, columns));
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      const std::string pad(width[i] - r[i].size(), ' ');
      line += i == 0 ? r[i] + pad : "  " + pad + r[i];
    }
    out += line.substr(0, line.find_last_not_of(' ') + 1) + "\n";
  }
  return out;
}

std::string eval_columns_json(const std::vector<EvalColumn>& columns) {
  if (columns.size() == 1) return eval_result_json(columns[0].result);
  nlohmann::json j = nlohmann::json::object();
  for (const EvalColumn& c : columns) j[c.name] = nlohmann::json::parse(eval_result_json(c.result));
  return j.dump();
}

Status write_eval_report(const EvalReportOptions& options, const std::vector<EvalColumn>& columns,
                         const std::vector<EvalRecord>& records) {
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) return io_error("eval report: cannot create ", options.dir, ": ", ec.message());
  std::ostringstream md;
  md << "# " << options.title << "\n\n";
  if (!options.data_file.empty()) md << "Data: `" << options.data_file << "`\n\n";
  if (!options.device.empty()) md << "Device: " << options.device << "\n\n";
  md << md_table(columns) << "\n";
  md << "Loss is the mean over supervised tokens; perplexity is exp(loss). Exact match and F1 compare the "
        "greedy continuation with the reference after normalization (lowercase, punctuation removed, "
        "whitespace collapsed); F1 is over whitespace tokens.\n\n";
  if (options.metrics_path) {
    LATHE_TRY(write_loss_svg(*options.metrics_path, (fs::path(options.dir) / "loss_curves.svg").string(),
                             {.title = "Training loss"}));
    md << "## Training loss\n\n![loss curves](loss_curves.svg)\n\nFrom `" << *options.metrics_path << "`.\n\n";
  }
  md << "## Predictions (first " << options.max_records << " records)\n\n"
     << md_predictions(columns, records, options.max_records);
  return write_file(fs::path(options.dir) / "report.md", md.str());
}

std::optional<std::string> find_run_metrics(const std::string& adapter_dir) {
  if (adapter_dir.empty()) return std::nullopt;
  fs::path dir = fs::absolute(fs::path(adapter_dir)).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "run/adapter/"
  for (const fs::path& p : {dir / "metrics.jsonl", dir.parent_path() / "metrics.jsonl",
                            dir.parent_path().parent_path() / "metrics.jsonl"}) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  return std::nullopt;
}

}  // namespace lathe
