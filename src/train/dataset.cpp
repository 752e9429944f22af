// JSONL loading for fine-tuning data sets: file layout, per-line parsing with
// errors located at file:line, parallel tokenization, and the truncation and
// error policies of dataset.h. A file is read whole before tokenizing; lines
// are tokenized in parallel and then folded in line order, so results, errors
// and counts do not depend on the thread count.
#include "train/dataset.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/log.h"
#include "core/parallel.h"

namespace lathe {

namespace fs = std::filesystem;

Result<Truncation> parse_truncation(std::string_view s) {
  if (s == "right") return Truncation::kRight;
  if (s == "drop") return Truncation::kDrop;
  return invalid_argument("data.truncation: expected right or drop, got \"", s, "\"");
}

Result<OnError> parse_on_error(std::string_view s) {
  if (s == "stop") return OnError::kStop;
  if (s == "skip") return OnError::kSkip;
  return invalid_argument("data.on_error: expected stop or skip, got \"", s, "\"");
}

Status DataOptions::validate() const {
  if (seq_length < 2) return invalid_argument("data.seq_length must be at least 2, got ", seq_length);
  if (label_key.empty()) return invalid_argument("data.label_key must not be empty");
  return PromptTemplate::parse(prompt_template, label_key).status().with_context("data.prompt_template");
}

const char* split_file_name(Split split) {
  switch (split) {
    case Split::kTrain: return "training.jsonl";
    case Split::kValidation: return "validation.jsonl";
    case Split::kTest: return "test.jsonl";
  }
  return "";
}

Result<std::optional<std::string>> find_split_file(const std::string& path, Split split) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return not_found("data: ", path, " does not exist");
  if (!fs::is_directory(st)) {
    if (split == Split::kTrain) return std::optional<std::string>(path);
    return std::optional<std::string>();
  }
  fs::path file = fs::path(path) / split_file_name(split);
  if (fs::exists(file, ec)) return std::optional<std::string>(file.string());
  if (split == Split::kTrain)
    return not_found("data: ", path, " has no training.jsonl (expected training.jsonl, validation.jsonl, ",
                     "test.jsonl, or pass a single .jsonl file)");
  return std::optional<std::string>();
}

void DatasetStats::merge(const DatasetStats& o) {
  n_records += o.n_records;
  n_examples += o.n_examples;
  n_skipped += o.n_skipped;
  n_truncated += o.n_truncated;
  n_dropped_too_long += o.n_dropped_too_long;
  n_dropped_no_target += o.n_dropped_no_target;
  n_tokens += o.n_tokens;
  n_supervised_tokens += o.n_supervised_tokens;
  max_tokens = std::max(max_tokens, o.max_tokens);
  for (const std::string& e : o.first_errors)
    if (first_errors.size() < kMaxErrors) first_errors.push_back(e);
}

std::string describe(const DatasetStats& s) {
  std::ostringstream os;
  os << s.n_records << " records -> " << s.n_examples << " examples, " << s.n_tokens << " tokens ("
     << s.n_supervised_tokens << " supervised), longest " << s.max_tokens;
  if (s.n_truncated) os << ", " << s.n_truncated << " truncated";
  if (s.n_dropped_too_long) os << ", " << s.n_dropped_too_long << " dropped as too long";
  if (s.n_dropped_no_target) os << ", " << s.n_dropped_no_target << " dropped without targets";
  if (s.n_skipped) os << ", " << s.n_skipped << " malformed skipped";
  return os.str();
}

namespace {

// Strips nlohmann's "[json.exception.parse_error.101] " tag from a message.
std::string json_reason(const std::string& what) {
  if (!what.empty() && what[0] == '[') {
    size_t close = what.find("] ");
    if (close != std::string::npos) return what.substr(close + 2);
  }
  return what;
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

Result<std::vector<std::string>> read_lines(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return io_error("data: cannot open ", file);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  if (in.bad()) return io_error("data: read error in ", file);
  return lines;
}

// Applies the truncation policy to ex; returns false when it is dropped.
bool apply_truncation(Example& ex, const DataOptions& opt, DatasetStats& stats) {
  if (static_cast<int64_t>(ex.input_ids.size()) > opt.seq_length) {
    if (opt.truncation == Truncation::kDrop) {
      ++stats.n_dropped_too_long;
      return false;
    }
    bool had_targets = ex.n_targets() > 0;
    ex.input_ids.resize(static_cast<size_t>(opt.seq_length));
    ex.loss_mask.resize(static_cast<size_t>(opt.seq_length));
    if (had_targets && ex.n_targets() == 0) {
      ++stats.n_dropped_too_long;
      return false;
    }
    ++stats.n_truncated;
  }
  if (ex.n_targets() == 0) {
    ++stats.n_dropped_no_target;
    return false;
  }
  return true;
}

// One warning per kind of record left out, so nothing is dropped silently.
void warn_counts(const std::string& file, const DataOptions& opt, const DatasetStats& stats) {
  std::ostringstream os;
  if (stats.n_skipped) {
    os << file << ": skipped " << stats.n_skipped << " malformed records (data.on_error=skip); first: "
       << stats.first_errors.front();
    LATHE_LOG(kWarn, os.str());
    os.str("");
  }
  if (stats.n_dropped_too_long) {
    os << file << ": dropped " << stats.n_dropped_too_long << " records longer than data.seq_length="
       << opt.seq_length
       << (opt.truncation == Truncation::kDrop ? " (data.truncation=drop)" : " whose targets all lie beyond it");
    LATHE_LOG(kWarn, os.str());
    os.str("");
  }
  if (stats.n_dropped_no_target) {
    os << file << ": dropped " << stats.n_dropped_no_target << " records without any supervised token";
    LATHE_LOG(kWarn, os.str());
  }
}

Status load_file(const std::string& file, const DataOptions& opt, const PromptTemplate& prompt,
                 const TextCodec& codec, SftDataset& out) {
  LATHE_ASSIGN_OR_RETURN(std::vector<std::string> lines, read_lines(file));
  std::vector<std::optional<Result<Example>>> built(lines.size());
  parallel_for(static_cast<int64_t>(lines.size()), 32, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      auto idx = static_cast<size_t>(i);
      if (!is_blank(lines[idx])) built[idx] = example_from_line(lines[idx], prompt, codec);
    }
  });
  DatasetStats stats;
  for (size_t i = 0; i < built.size(); ++i) {
    if (!built[i]) continue;
    ++stats.n_records;
    Result<Example>& r = *built[i];
    if (!r.is_ok()) {
      std::ostringstream where;
      where << file << ":" << i + 1;
      if (opt.on_error == OnError::kStop)
        return r.status().with_context(where.str() + " (data.on_error=skip skips bad records)");
      ++stats.n_skipped;
      if (stats.first_errors.size() < DatasetStats::kMaxErrors)
        stats.first_errors.push_back(where.str() + ": " + r.status().message());
      continue;
    }
    Example ex = std::move(r).value();
    if (!apply_truncation(ex, opt, stats)) continue;
    ++stats.n_examples;
    stats.n_tokens += static_cast<int64_t>(ex.input_ids.size());
    stats.n_supervised_tokens += ex.n_targets();
    stats.max_tokens = std::max(stats.max_tokens, static_cast<int64_t>(ex.input_ids.size()));
    out.examples.push_back(std::move(ex));
  }
  warn_counts(file, opt, stats);
  out.stats.merge(stats);
  out.files.push_back(file);
  return Status::ok();
}

}  // namespace

Result<Example> example_from_line(std::string_view line, const PromptTemplate& prompt, const TextCodec& codec) {
  nlohmann::ordered_json record;
  try {
    record = nlohmann::ordered_json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("invalid JSON: ", json_reason(e.what()));
  }
  if (!record.is_object()) return invalid_argument("a record must be a JSON object, got ", record.type_name());
  try {
    if (auto m = record.find("messages"); m != record.end()) return build_chat_example(*m, codec);
    if (record.contains("input_ids")) return build_pretokenized_example(record, codec);
    LATHE_ASSIGN_OR_RETURN(PromptTemplate::Rendered text, prompt.render(record));
    return build_prompt_example(text, codec);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("bad record: ", json_reason(e.what()));
  }
}

Result<SftDataset> load_sft_dataset(std::span<const std::string> files, const DataOptions& options,
                                    const TextCodec& codec) {
  LATHE_TRY(options.validate());
  LATHE_ASSIGN_OR_RETURN(PromptTemplate prompt, PromptTemplate::parse(options.prompt_template, options.label_key));
  SftDataset ds;
  for (const std::string& file : files) LATHE_TRY(load_file(file, options, prompt, codec, ds));
  return ds;
}

Result<DatasetStats> dataset_stats(std::span<const std::string> files, const DataOptions& options,
                                   const TextCodec& codec) {
  LATHE_ASSIGN_OR_RETURN(SftDataset ds, load_sft_dataset(files, options, codec));
  return ds.stats;
}

}  // namespace lathe
