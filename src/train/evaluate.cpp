// Evaluation: records from JSONL through the data pipeline's example
// builders, the loss from one all-logits forward pass per record (the CPU's
// EvalModel here; the GPU's in evaluate_cuda.cpp), and greedy continuations
// scored against the reference. The answer normalization works
// on code points: UTF-8 is decoded, lowercased where the script has case,
// punctuation and separators replaced by spaces, then re-encoded.
#include "train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "train/metrics.h"

namespace lathe {
namespace {

// ---- UTF-8 -------------------------------------------------------------
// Next code point of s at *i (advancing it); invalid bytes read as U+FFFD.
char32_t next_code_point(std::string_view s, size_t* i) {
  const auto b0 = uint8_t(s[*i]);
  int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
  if (len == 0 || *i + size_t(len) > s.size()) {
    ++*i;
    return 0xFFFD;
  }
  char32_t cp = len == 1 ? b0 : b0 & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    const auto b = uint8_t(s[*i + size_t(k)]);
    if ((b >> 6) != 2) {
      ++*i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  *i += size_t(len);
  return cp;
}

void append_utf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Simple lowercase mapping for the cased blocks of the BMP that text in
// evaluation sets uses: Latin (Basic, Latin-1, Extended-A), Greek, Cyrillic,
// fullwidth Latin. Other code points (Hangul, CJK, ...) are returned as is.
char32_t to_lower(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x138 && c != 0x149 && c != 0x178) {
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_upper ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
    return c;
  }
  if (c == 0x178) return 0xFF;
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x4FF)) && c % 2 == 0)
    return c + 1;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

bool is_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200B) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 ||
         c == 0xFEFF;
}

// ASCII punctuation and symbols (Python's string.punctuation), plus the
// punctuation blocks of Unicode: Latin-1 punctuation, General Punctuation,
// CJK Symbols and Punctuation, fullwidth and halfwidth forms, and the
// single-character punctuation of other scripts that evaluation text uses.
bool is_punct(char32_t c) {
  if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                       (c >= 0x7B && c <= 0x7E);
  switch (c) {
    case 0xA1: case 0xA7: case 0xAB: case 0xB6: case 0xB7: case 0xBB: case 0xBF:
    case 0x37E: case 0x387: case 0x55D: case 0x589: case 0x5BE: case 0x5C3:
    case 0x60C: case 0x61B: case 0x61F: case 0x6D4: case 0x964: case 0x965:
      return true;
    default:
      break;
  }
  return (c >= 0x2010 && c <= 0x2027) || (c >= 0x2030 && c <= 0x205E) || (c >= 0x3001 && c <= 0x3003) ||
         (c >= 0x3008 && c <= 0x3011) || (c >= 0x3014 && c <= 0x301F) || c == 0x30FB ||
         (c >= 0xFE10 && c <= 0xFE19) || (c >= 0xFE30 && c <= 0xFE4F) || (c >= 0xFE50 && c <= 0xFE6B) ||
         (c >= 0xFF01 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF20) || (c >= 0xFF3B && c <= 0xFF40) ||
         (c >= 0xFF5B && c <= 0xFF65);
}

std::vector<std::string> split_tokens(const std::string& normalized) {
  std::vector<std::string> out;
  std::istringstream in(normalized);
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

Result<std::vector<std::string>> read_lines(const std::string& file) {
  std::ifstream f(file, std::ios::binary);
  if (!f) return not_found("eval: cannot open ", file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(line);
  return lines;
}

// The record's kind decides what is measured: {input, output}-style records
// (anything that is neither chat nor pre-tokenized) are also generated.
Result<EvalRecord> record_from_line(const std::string& line, const PromptTemplate& prompt, const TextCodec& codec) {
  LATHE_ASSIGN_OR_RETURN(Example ex, example_from_line(line, prompt, codec));
  EvalRecord rec;
  rec.example = std::move(ex);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, false);
  if (!j.is_object() || j.contains("messages") || j.contains("input_ids")) return rec;
  auto label = j.find(prompt.label_key());
  if (label == j.end() || !label->is_string()) return rec;
  rec.reference = label->get<std::string>();
  LATHE_ASSIGN_OR_RETURN(PromptTemplate::Rendered text, prompt.render(j));
  rec.prompt_text = text.prompt;
  const auto& m = rec.example.loss_mask;
  const size_t first = size_t(std::find(m.begin(), m.end(), uint8_t(1)) - m.begin());
  rec.generation_context = std::vector<int32_t>(rec.example.input_ids.begin(), rec.example.input_ids.begin() + first);
  return rec;
}

}  // namespace

std::string normalize_answer(std::string_view text) {
  std::string out;
  bool pending_space = false;
  for (size_t i = 0; i < text.size();) {
    const char32_t c = next_code_point(text, &i);
    if (is_space(c) || is_punct(c)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    append_utf8(to_lower(c), &out);
  }
  return out;
}

double exact_match_score(std::string_view prediction, std::string_view reference) {
  return normalize_answer(prediction) == normalize_answer(reference) ? 1.0 : 0.0;
}

double token_f1_score(std::string_view prediction, std::string_view reference) {
  const std::vector<std::string> p = split_tokens(normalize_answer(prediction));
  const std::vector<std::string> r = split_tokens(normalize_answer(reference));
  if (p.empty() || r.empty()) return p.empty() && r.empty() ? 1.0 : 0.0;
  std::map<std::string, int64_t> counts;
  for (const std::string& t : r) ++counts[t];
  int64_t common = 0;
  for (const std::string& t : p) {
    auto it = counts.find(t);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++common;
    }
  }
  if (common == 0) return 0.0;
  const double precision = double(common) / double(p.size()), recall = double(common) / double(r.size());
  return 2 * precision * recall / (precision + recall);
}

Result<std::vector<EvalRecord>> load_eval_records(const std::string& file, const DataOptions& options,
                                                  const TextCodec& codec, int64_t* n_dropped) {
  LATHE_TRY(options.validate());
  LATHE_ASSIGN_OR_RETURN(PromptTemplate prompt, PromptTemplate::parse(options.prompt_template, options.label_key));
  LATHE_ASSIGN_OR_RETURN(std::vector<std::string> lines, read_lines(file));
  std::vector<EvalRecord> out;
  *n_dropped = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t\r") == std::string::npos) continue;
    auto rec = record_from_line(lines[i], prompt, codec);
    if (!rec.is_ok()) return invalid_argument(file, ":", i + 1, ": ", rec.status().message());
    Example& ex = rec->example;
    if (int64_t(ex.input_ids.size()) > options.seq_length) {
      ex.input_ids.resize(size_t(options.seq_length));
      ex.loss_mask.resize(size_t(options.seq_length));
    }
    if (ex.n_targets() == 0) {
      ++*n_dropped;
      continue;
    }
    out.push_back(std::move(rec).value());
  }
  if (out.empty()) return invalid_argument(file, ": no record with a supervised token");
  return out;
}

double example_nll_sum_rows(const Example& ex, TensorView logits, int64_t first) {
  const int64_t rows = logits.shape[0], vocab = logits.shape[1];
  const auto n = int64_t(ex.input_ids.size());
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = first + r + 1;  // the token this row predicts
    if (i >= n || !ex.loss_mask[size_t(i)]) continue;
    const float* row = logits.ptr<const float>() + r * vocab;
    const float mx = *std::max_element(row, row + vocab);
    double z = 0;
    for (int64_t v = 0; v < vocab; ++v) z += std::exp(double(row[v]) - mx);
    sum += std::log(z) + mx - row[ex.input_ids[size_t(i)]];
  }
  return sum;
}

double example_nll_sum(const Example& ex, TensorView logits) { return example_nll_sum_rows(ex, logits, 0); }

Result<std::vector<int32_t>> greedy_generate(const CausalLM& model, std::span<const int32_t> context,
                                             int max_new_tokens, std::span<const int32_t> stop_ids) {
  std::vector<int32_t> out;
  if (max_new_tokens <= 0) return out;
  if (context.empty()) return invalid_argument("greedy_generate: empty context");
  const int64_t vocab = model.config().vocab_size;
  KvCache cache = model.new_cache(int(context.size()) + max_new_tokens);
  Tensor logits = Tensor::empty(DType::F32, {1, vocab});
  LATHE_TRY(model.forward(context, cache, logits, false));
  for (int step = 0; step < max_new_tokens; ++step) {
    const float* row = logits.data<float>();
    const auto next = int32_t(std::max_element(row, row + vocab) - row);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
    out.push_back(next);
    if (step + 1 == max_new_tokens) break;
    LATHE_TRY(model.forward(std::span<const int32_t>(&out.back(), 1), cache, logits, false));
  }
  return out;
}

namespace {

// The CPU's EvalModel: one all-logits forward per example, greedy_generate().
class CpuEvalModel : public EvalModel {
 public:
  explicit CpuEvalModel(const CausalLM& model) : model_(model) {}
  const ModelConfig& config() const override { return model_.config(); }
  Device device() const override { return Device::cpu(); }
  Result<double> nll_sum(const Example& ex) override {
    const auto n = int64_t(ex.input_ids.size());
    KvCache cache = model_.new_cache(int(n));
    Tensor logits = Tensor::empty(DType::F32, {n, model_.config().vocab_size});
    LATHE_TRY(model_.forward(ex.input_ids, cache, logits, true));
    return example_nll_sum(ex, logits);
  }
  Result<std::vector<int32_t>> greedy(std::span<const int32_t> context, int max_new_tokens,
                                      std::span<const int32_t> stop_ids) override {
    return greedy_generate(model_, context, max_new_tokens, stop_ids);
  }

 private:
  const CausalLM& model_;
};

}  // namespace

std::unique_ptr<EvalModel> cpu_eval_model(const CausalLM& model) { return std::make_unique<CpuEvalModel>(model); }

Result<EvalResult> evaluate(EvalModel& model, std::span<const EvalRecord> records, const EvalOptions& options) {
  if (options.generate && !options.decode) return invalid_argument("evaluate: generation needs a decode function");
  EvalResult r;
  double nll = 0, em = 0, f1 = 0;
  for (const EvalRecord& rec : records) {
    const Example& ex = rec.example;
    RecordResult out;
    LATHE_ASSIGN_OR_RETURN(const double sum, model.nll_sum(ex));
    out.n_targets = ex.n_targets();
    out.loss = out.n_targets > 0 ? sum / double(out.n_targets) : 0.0;
    nll += sum;
    r.n_supervised_tokens += out.n_targets;
    if (options.generate && rec.generation_context && rec.reference && !rec.generation_context->empty()) {
      LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                             model.greedy(*rec.generation_context, options.max_new_tokens, options.stop_ids));
      out.prediction = options.decode(ids);
      out.exact_match = exact_match_score(*out.prediction, *rec.reference);
      out.f1 = token_f1_score(*out.prediction, *rec.reference);
      em += out.exact_match;
      f1 += out.f1;
      ++r.n_generated;
    }
    r.records.push_back(std::move(out));
  }
  r.n_records = int64_t(records.size());
  r.loss = r.n_supervised_tokens > 0 ? nll / double(r.n_supervised_tokens) : 0.0;
  r.perplexity = perplexity_of(r.loss);
  if (r.n_generated > 0) {
    r.exact_match = em / double(r.n_generated);
    r.f1 = f1 / double(r.n_generated);
  }
  return r;
}

Result<EvalResult> evaluate(const CausalLM& model, std::span<const EvalRecord> records, const EvalOptions& options) {
  CpuEvalModel m(model);
  return evaluate(m, records, options);
}

std::string eval_result_json(const EvalResult& r) {
  nlohmann::json j;
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  j["loss"] = num(r.loss);
  j["perplexity"] = num(r.perplexity);
  j["exact_match"] = r.exact_match ? num(*r.exact_match) : nlohmann::json(nullptr);
  j["f1"] = r.f1 ? num(*r.f1) : nlohmann::json(nullptr);
  j["n_records"] = r.n_records;
  return j.dump();
}

}  // namespace lathe
