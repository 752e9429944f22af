// The recipe key registry: for every dotted key, how to parse a value into its
// TrainRecipe field and how to render the field back. Parsing is one codec per
// field type (bool, int, float, string, enum, lists), so every key of a type
// accepts and rejects exactly the same spellings. Values reach the codecs as
// text, from YAML scalars and sequences or from command-line overrides alike.
// yaml-cpp throws; every call into it is wrapped here and comes out a Status.
// yaml-cpp 0.7's node headers trip GCC 12's -Wdangling-pointer when inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#include <yaml-cpp/yaml.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "train/recipe.h"

namespace lathe {
namespace {

// A value as written: one scalar, or a list of scalars.
struct RawValue {
  bool is_list = false;
  std::string scalar;
  std::vector<std::string> items;
  std::string shown() const {  // for error messages
    if (!is_list) return scalar;
    std::string s = "[";
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) s += ", ";
      s += items[i];
    }
    return s + "]";
  }
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string unquote(std::string_view s) {
  s = trim(s);
  if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"') && s.back() == s.front()) {
    s = s.substr(1, s.size() - 2);
  }
  return std::string(s);
}

// "[a, b]", "a,b" or a scalar: the items of a list-typed value.
std::vector<std::string> list_items(const RawValue& v) {
  if (v.is_list) return v.items;
  std::string_view s = trim(v.scalar);
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  std::vector<std::string> out;
  if (trim(s).empty()) return out;
  size_t start = 0;
  while (true) {
    size_t comma = s.find(',', start);
    out.push_back(unquote(s.substr(start, comma == std::string_view::npos ? s.npos : comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

Status expected(std::string_view type) { return invalid_argument("expected ", type); }

Result<int64_t> parse_int(std::string_view s) {
  s = trim(s);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return expected("an integer");
  return v;
}

Result<double> parse_float(std::string_view s) {
  s = trim(s);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  double v = 0.0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v)) {
    return expected("a finite number");
  }
  return v;
}

// Shortest text that reads back to the same double, always with a '.' in the
// mantissa (32.0, 1.0e-05) so YAML 1.1 readers (PyYAML) see a float too.
std::string render_float(double v) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ptr);
  if (s.find('.') == std::string::npos) {
    const size_t e = s.find('e');
    s.insert(e == std::string::npos ? s.size() : e, ".0");
  }
  return s;
}

// YAML double-quoted scalar.
std::string render_string(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\x%02x", c);
          out += hex;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

template <class T>
struct Codec;

template <>
struct Codec<bool> {
  static constexpr std::string_view kType = "bool";
  static Result<bool> parse(const RawValue& v) {
    if (v.is_list) return expected("true or false");
    const std::string_view s = trim(v.scalar);
    for (std::string_view t : {"true", "True", "TRUE", "yes", "on", "1"}) if (s == t) return true;
    for (std::string_view f : {"false", "False", "FALSE", "no", "off", "0"}) if (s == f) return false;
    return expected("true or false");
  }
  static std::string render(bool b) { return b ? "true" : "false"; }
};

template <>
struct Codec<int64_t> {
  static constexpr std::string_view kType = "int";
  static Result<int64_t> parse(const RawValue& v) {
    if (v.is_list) return expected("an integer");
    return parse_int(v.scalar);
  }
  static std::string render(int64_t x) { return std::to_string(x); }
};

template <>
struct Codec<double> {
  static constexpr std::string_view kType = "float";
  static Result<double> parse(const RawValue& v) {
    if (v.is_list) return expected("a finite number");
    return parse_float(v.scalar);
  }
  static std::string render(double x) { return render_float(x); }
};

template <>
struct Codec<std::string> {
  static constexpr std::string_view kType = "string";
  static Result<std::string> parse(const RawValue& v) {
    if (v.is_list) return expected("a string");
    return v.scalar;
  }
  static std::string render(const std::string& s) { return render_string(s); }
};

template <>
struct Codec<std::array<double, 2>> {
  static constexpr std::string_view kType = "list";
  static Result<std::array<double, 2>> parse(const RawValue& v) {
    std::vector<std::string> items = list_items(v);
    if (items.size() != 2) return expected("a list of two numbers, e.g. [0.9, 0.98]");
    std::array<double, 2> out{};
    for (size_t i = 0; i < 2; ++i) {
      auto x = parse_float(items[i]);
      if (!x.is_ok()) return expected("a list of two numbers, e.g. [0.9, 0.98]");
      out[i] = *x;
    }
    return out;
  }
  static std::string render(const std::array<double, 2>& a) {
    std::string out = "[";
    out += render_float(a[0]);
    out += ", ";
    out += render_float(a[1]);
    out += "]";
    return out;
  }
};

// Enums: a table of (name, value); the first name of each value is canonical,
// later ones are accepted spellings (NeMo's scheduler class names).
template <class E>
struct EnumNames;
template <>
struct EnumNames<PeftScheme> {
  static constexpr std::pair<std::string_view, PeftScheme> kNames[] = {{"lora", PeftScheme::kLora},
                                                                        {"none", PeftScheme::kNone}};
};
template <>
struct EnumNames<LoraDropoutPosition> {
  static constexpr std::pair<std::string_view, LoraDropoutPosition> kNames[] = {
      {"pre", LoraDropoutPosition::kPre}, {"post", LoraDropoutPosition::kPost}};
};
template <>
struct EnumNames<Truncation> {
  static constexpr std::pair<std::string_view, Truncation> kNames[] = {{"right", Truncation::kRight},
                                                                        {"drop", Truncation::kDrop}};
};
template <>
struct EnumNames<OnError> {
  static constexpr std::pair<std::string_view, OnError> kNames[] = {
      {"stop", OnError::kStop}, {"skip", OnError::kSkip}, {"fail", OnError::kStop}};
};
template <>
struct EnumNames<Precision> {
  static constexpr std::pair<std::string_view, Precision> kNames[] = {
      {"32", Precision::kF32}, {"32-true", Precision::kF32}, {"bf16-mixed", Precision::kBf16Mixed}};
};
template <>
struct EnumNames<OptimizerName> {
  static constexpr std::pair<std::string_view, OptimizerName> kNames[] = {{"adamw", OptimizerName::kAdamW}};
};
template <>
struct EnumNames<ResumeMode> {
  static constexpr std::pair<std::string_view, ResumeMode> kNames[] = {{"auto", ResumeMode::kAuto},
                                                                        {"none", ResumeMode::kNone}};
};
template <>
struct EnumNames<LrScheduleKind> {
  static constexpr std::pair<std::string_view, LrScheduleKind> kNames[] = {
      {"cosine", LrScheduleKind::kCosine},         {"linear", LrScheduleKind::kLinear},
      {"constant", LrScheduleKind::kConstant},     {"CosineAnnealing", LrScheduleKind::kCosine},
      {"WarmupAnnealing", LrScheduleKind::kLinear}, {"WarmupPolicy", LrScheduleKind::kConstant}};
};

template <class E>
std::string enum_choices() {
  std::string out;
  std::vector<E> seen;
  for (const auto& [name, value] : EnumNames<E>::kNames) {
    if (std::find(seen.begin(), seen.end(), value) != seen.end()) continue;
    seen.push_back(value);
    if (!out.empty()) out += '|';
    out += name;
  }
  return out;
}

template <class E>
  requires std::is_enum_v<E>
struct Codec<E> {
  static constexpr std::string_view kType = "enum";
  static Result<E> parse(const RawValue& v) {
    if (!v.is_list) {
      const std::string_view s = trim(v.scalar);
      for (const auto& [name, value] : EnumNames<E>::kNames) if (name == s) return value;
    }
    return expected("one of " + enum_choices<E>());
  }
  static std::string render(E e) {
    for (const auto& [name, value] : EnumNames<E>::kNames) if (value == e) return std::string(name);
    return "?";
  }
  static std::string choices() { return enum_choices<E>(); }
};

// The module names peft.target_modules accepts: NeMo's Megatron names, then HF's.
constexpr std::string_view kModuleNames[] = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2",
                                             "q_proj",     "k_proj",      "v_proj",     "o_proj",
                                             "gate_proj",  "up_proj",     "down_proj"};

struct TargetModulesCodec {
  static constexpr std::string_view kType = "list";
  static std::string choices() {
    std::string out;
    for (std::string_view m : kModuleNames) {
      if (!out.empty()) out += '|';
      out += m;
    }
    return out;
  }
  static Result<std::vector<std::string>> parse(const RawValue& v) {
    std::vector<std::string> items = list_items(v);
    for (const std::string& m : items) {
      if (std::find(std::begin(kModuleNames), std::end(kModuleNames), m) == std::end(kModuleNames)) {
        return invalid_argument("expected a list of module names from ", choices(), "; '", m, "' is not one");
      }
    }
    return items;
  }
  static std::string render(const std::vector<std::string>& items) {
    std::string out = "[";
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += ", ";
      out += items[i];
    }
    return out + "]";
  }
};

template <class C>
concept HasChoices = requires { C::choices(); };

struct KeyDef {
  std::string_view name;
  std::string_view doc;
  std::string_view type;
  std::string choices;  // enums and target_modules: "a|b|c"
  Status (*set)(TrainRecipe&, const RawValue&);
  std::string (*render)(const TrainRecipe&);
};

// Get: a stateless lambda TrainRecipe& -> T*, naming the field.
template <class C, class Get>
KeyDef make_key_as(std::string_view name, std::string_view doc, Get) {
  KeyDef k{.name = name, .doc = doc, .type = C::kType, .choices = {}, .set = nullptr, .render = nullptr};
  if constexpr (HasChoices<C>) k.choices = C::choices();
  k.set = [](TrainRecipe& r, const RawValue& v) -> Status {
    auto parsed = C::parse(v);
    if (!parsed.is_ok()) return parsed.status();
    *Get{}(r) = std::move(parsed).value();
    return Status::ok();
  };
  k.render = [](const TrainRecipe& r) { return C::render(*Get{}(const_cast<TrainRecipe&>(r))); };
  return k;
}

template <class Get>
KeyDef make_key(std::string_view name, std::string_view doc, Get get) {
  using T = std::remove_pointer_t<decltype(Get{}(std::declval<TrainRecipe&>()))>;
  return make_key_as<Codec<T>>(name, doc, get);
}

#define LATHE_FIELD(path) [](TrainRecipe& r) { return &r.path; }

// Keys of one section stay contiguous: recipe_to_yaml relies on it.
const std::vector<KeyDef>& key_defs() {
  static const std::vector<KeyDef> defs = {
      make_key("peft.peft_scheme", "lora: train LoRA adapters; none: full-parameter SFT",
               LATHE_FIELD(peft.peft_scheme)),
      make_key("peft.dim", "LoRA rank r (NeMo's default 32)", LATHE_FIELD(peft.dim)),
      make_key("peft.alpha", "LoRA alpha; scale = alpha/dim (NeMo's default 32)", LATHE_FIELD(peft.alpha)),
      make_key("peft.dropout", "dropout on the LoRA path, in [0, 1)", LATHE_FIELD(peft.dropout)),
      make_key("peft.dropout_position", "dropout before the LoRA A matmul (pre) or after B (post)",
               LATHE_FIELD(peft.dropout_position)),
      make_key("peft.rslora", "rank-stabilized LoRA: scale = alpha/sqrt(dim)", LATHE_FIELD(peft.rslora)),
      make_key_as<TargetModulesCodec>("peft.target_modules",
                                      "linears that get adapters, NeMo or HF names (default: all seven)",
                                      LATHE_FIELD(peft.target_modules)),
      make_key("trainer.max_steps", "optimizer steps to run; -1: run trainer.max_epochs",
               LATHE_FIELD(trainer.max_steps)),
      make_key("trainer.max_epochs", "passes over the training set; -1: no limit",
               LATHE_FIELD(trainer.max_epochs)),
      make_key("trainer.val_check_interval", "validate every N steps; 0: only at the end",
               LATHE_FIELD(trainer.val_check_interval)),
      make_key("trainer.limit_val_batches", "validation batches per check; -1: all, 0: no validation",
               LATHE_FIELD(trainer.limit_val_batches)),
      make_key("trainer.log_every_n_steps", "steps between metric lines", LATHE_FIELD(trainer.log_every_n_steps)),
      make_key("trainer.gradient_clip_val", "clip gradients to this global L2 norm; 0: off",
               LATHE_FIELD(trainer.gradient_clip_val)),
      make_key("trainer.seed", "seed for initialization and dropout", LATHE_FIELD(trainer.seed)),
      make_key("trainer.activations_checkpoint", "recompute activations in backward to save memory",
               LATHE_FIELD(trainer.activations_checkpoint)),
      make_key("trainer.activations_checkpoint_granularity",
               "full, or selective (GPU: keep attention output and gate|up, rerun norms, q|k|v, o, RoPE)",
               LATHE_FIELD(trainer.activations_checkpoint_granularity)),
      make_key("trainer.gpu_memory_gib",
               "GiB of GPU memory the run may hold (recompute is chosen to fit; spare lets layers keep q|k|v; "
               "below the least plan: refused); 0: the memory free at start",
               LATHE_FIELD(trainer.gpu_memory_gib)),
      make_key("trainer.precision", "32, or bf16-mixed: the frozen base in bf16 (LoRA only)",
               LATHE_FIELD(trainer.precision)),
      make_key("data.dataset_root", "directory with training/validation/test.jsonl, or one .jsonl file",
               LATHE_FIELD(data.dataset_root)),
      make_key("data.seq_length", "maximum tokens per example (or per packed row)", LATHE_FIELD(data.seq_length)),
      make_key("data.micro_batch_size", "examples per forward/backward on one rank",
               LATHE_FIELD(data.micro_batch_size)),
      make_key("data.global_batch_size", "examples per optimizer step over all ranks",
               LATHE_FIELD(data.global_batch_size)),
      make_key("data.prompt_template", "how {input} and {output} records become text; loss on {output}",
               LATHE_FIELD(data.prompt_template)),
      make_key("data.label_key", "the record field the loss is taken on (its {placeholder} ends the template)",
               LATHE_FIELD(data.label_key)),
      make_key("data.packed_sequence", "pack several examples into each seq_length row",
               LATHE_FIELD(data.packed_sequence)),
      make_key("data.truncation", "over-long examples keep their first seq_length tokens (right) or are dropped",
               LATHE_FIELD(data.truncation)),
      make_key("data.on_error", "a malformed record stops the load (stop, alias fail) or is skipped and counted",
               LATHE_FIELD(data.on_error)),
      make_key("data.shuffle", "shuffle training examples every epoch", LATHE_FIELD(data.shuffle)),
      make_key("data.seed", "seed for the data order", LATHE_FIELD(data.seed)),
      make_key("optim.name", "optimizer", LATHE_FIELD(optim.name)),
      make_key("optim.lr", "peak learning rate", LATHE_FIELD(optim.lr)),
      make_key("optim.weight_decay", "decoupled (AdamW) weight decay", LATHE_FIELD(optim.weight_decay)),
      make_key("optim.betas", "Adam [beta1, beta2]", LATHE_FIELD(optim.betas)),
      make_key("optim.eps", "Adam epsilon", LATHE_FIELD(optim.eps)),
      make_key("optim.no_decay_norm_and_bias", "exempt norm weights and biases from weight decay",
               LATHE_FIELD(optim.no_decay_norm_and_bias)),
      make_key("optim.sched.name", "learning-rate schedule after warmup", LATHE_FIELD(optim.sched.name)),
      make_key("optim.sched.warmup_steps", "linear warmup steps", LATHE_FIELD(optim.sched.warmup_steps)),
      make_key("optim.sched.min_lr", "learning rate at the end of the decay", LATHE_FIELD(optim.sched.min_lr)),
      make_key("optim.sched.max_steps", "steps the decay spans; -1: the whole run",
               LATHE_FIELD(optim.sched.max_steps)),
      make_key("checkpoint.dir", "where checkpoints go, a path or s3://bucket/prefix; empty: <run-dir>/checkpoints",
               LATHE_FIELD(checkpoint.dir)),
      make_key("checkpoint.every_n_train_steps", "save every N steps; 0: whenever validation runs; -1: never by step",
               LATHE_FIELD(checkpoint.every_n_train_steps)),
      make_key("checkpoint.train_time_interval", "also save when this many minutes passed since the last save; 0: off",
               LATHE_FIELD(checkpoint.train_time_interval)),
      make_key("checkpoint.save_top_k", "keep the best k by checkpoint.monitor; -1: all; 0 and no save_last: none",
               LATHE_FIELD(checkpoint.save_top_k)),
      make_key("checkpoint.monitor", "metric ranking checkpoints, lower is better [val_loss|train_loss]",
               LATHE_FIELD(checkpoint.monitor)),
      make_key("checkpoint.save_last", "always keep the newest checkpoint besides the top k",
               LATHE_FIELD(checkpoint.save_last)),
      make_key("checkpoint.async_save", "write checkpoints in the background while training continues",
               LATHE_FIELD(checkpoint.async_save)),
      make_key("resume.mode", "auto: continue from checkpoint.dir's newest committed checkpoint if any (alias: resume=)",
               LATHE_FIELD(resume.mode)),
      make_key("resume.path", "resume from this checkpoint or checkpoints root (its last); overrides resume.mode",
               LATHE_FIELD(resume.path)),
  };
  return defs;
}

#undef LATHE_FIELD

const KeyDef* find_key(std::string_view name) {
  for (const KeyDef& k : key_defs()) if (k.name == name) return &k;
  return nullptr;
}

// True when some key lives under "prefix.".
bool is_section(std::string_view prefix) {
  for (const KeyDef& k : key_defs()) {
    if (k.name.size() > prefix.size() && k.name.substr(0, prefix.size()) == prefix && k.name[prefix.size()] == '.') {
      return true;
    }
  }
  return false;
}

std::string_view first_key_in(std::string_view section) {
  for (const KeyDef& k : key_defs()) {
    if (k.name.size() > section.size() && k.name.substr(0, section.size()) == section) return k.name;
  }
  return {};
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string_view leaf(std::string_view key) {
  const size_t dot = key.rfind('.');
  return dot == std::string_view::npos ? key : key.substr(dot + 1);
}

// Names PEFT, HF and Lightning users reach for, mapped to ours.
constexpr std::pair<std::string_view, std::string_view> kSynonyms[] = {
    {"r", "peft.dim"},           {"rank", "peft.dim"},          {"lora_r", "peft.dim"},
    {"lora_alpha", "peft.alpha"}, {"lora_dropout", "peft.dropout"}, {"use_rslora", "peft.rslora"},
    {"learning_rate", "optim.lr"}, {"lr", "optim.lr"},            {"warmup", "optim.sched.warmup_steps"},
    {"gradient_clipping", "trainer.gradient_clip_val"},          {"max_seq_length", "data.seq_length"},
};

std::string closest_key(std::string_view unknown) {
  for (const auto& [from, to] : kSynonyms) if (leaf(unknown) == from) return std::string(to);
  std::string_view best;
  size_t best_score = SIZE_MAX;
  for (const KeyDef& k : key_defs()) {
    const size_t score = std::min(edit_distance(unknown, k.name), edit_distance(leaf(unknown), leaf(k.name)) + 1);
    if (score < best_score) best_score = score, best = k.name;
  }
  return std::string(best);
}

Status unknown_key(std::string_view key) {
  return invalid_argument("unknown recipe key '", key, "'; did you mean '", closest_key(key),
                          "'? (`lathe finetune --help` lists every key)");
}

Status set_raw(TrainRecipe* r, std::string_view key, const RawValue& v) {
  if (key == "resume") key = "resume.mode";  // resume=auto, as the docs and NeMo users write it
  const KeyDef* k = find_key(key);
  if (k == nullptr) {
    if (is_section(key)) {
      return invalid_argument("'", key, "' is a group of keys, not a key; set one of its keys, e.g. '",
                              first_key_in(key), "'");
    }
    return unknown_key(key);
  }
  Status s = k->set(*r, v);
  if (!s.is_ok()) {
    return invalid_argument("key '", key, "' = '", v.shown(), "': ", s.message(), " (type ", k->type, ")");
  }
  return Status::ok();
}

// ---- YAML ----------------------------------------------------------------

Status at_line(std::string_view source, const YAML::Mark& mark, const Status& s) {
  if (mark.line < 0) return s.with_context(std::string(source));
  return s.with_context(std::string(source) + ":" + std::to_string(mark.line + 1));
}

Status apply_map(TrainRecipe* r, const YAML::Node& map, const std::string& prefix, std::string_view source,
                 std::set<std::string>* seen) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    const YAML::Node& k = it->first;
    const YAML::Node& v = it->second;
    if (!k.IsScalar()) return at_line(source, k.Mark(), invalid_argument("recipe keys must be plain names"));
    const std::string full = prefix.empty() ? k.Scalar() : prefix + "." + k.Scalar();
    if (find_key(full) == nullptr && is_section(full)) {
      if (full == "resume" && v.IsScalar()) {  // resume: auto
        if (!seen->insert("resume.mode").second) return at_line(source, k.Mark(), invalid_argument("key 'resume.mode' is set twice"));
        LATHE_TRY(at_line(source, v.Mark(), set_raw(r, "resume.mode", RawValue{.scalar = v.Scalar()})));
        continue;
      }
      if (!v.IsMap()) {
        return at_line(source, k.Mark(), invalid_argument("'", full, "' is a group of keys; give it a map, e.g. ",
                                                          full, ": {...}"));
      }
      LATHE_TRY(apply_map(r, v, full, source, seen));
      continue;
    }
    if (find_key(full) == nullptr) return at_line(source, k.Mark(), unknown_key(full));
    if (!seen->insert(full).second) return at_line(source, k.Mark(), invalid_argument("key '", full, "' is set twice"));
    RawValue raw;
    if (v.IsScalar()) {
      raw.scalar = v.Scalar();
    } else if (v.IsSequence()) {
      raw.is_list = true;
      for (const YAML::Node& item : v) {
        if (!item.IsScalar()) return at_line(source, item.Mark(), invalid_argument("key '", full, "': list items must be plain values"));
        raw.items.push_back(item.Scalar());
      }
    } else if (v.IsMap()) {
      return at_line(source, v.Mark(), invalid_argument("key '", full, "' takes a value, not a map"));
    } else {
      return at_line(source, k.Mark(), invalid_argument("key '", full, "' has no value"));
    }
    LATHE_TRY(at_line(source, v.Mark(), set_raw(r, full, raw)));
  }
  return Status::ok();
}

// A double-quoted command-line string is read as a YAML double-quoted scalar.
Result<std::string> decode_quoted(std::string_view text) {
  try {
    YAML::Node n = YAML::Load(std::string(text));
    if (n.IsScalar()) return n.Scalar();
  } catch (const YAML::Exception& e) {
    return invalid_argument("bad quoted string ", text, ": ", e.msg);
  }
  return invalid_argument("bad quoted string ", text);
}

}  // namespace

Status apply_recipe_yaml(TrainRecipe* r, std::string_view yaml_text, std::string_view source) {
  try {
    YAML::Node root = YAML::Load(std::string(yaml_text));
    if (root.IsNull()) return Status::ok();  // empty file: defaults
    if (!root.IsMap()) return at_line(source, root.Mark(), invalid_argument("a recipe must be a map of keys"));
    std::set<std::string> seen;
    return apply_map(r, root, "", source, &seen);
  } catch (const YAML::Exception& e) {
    return at_line(source, e.mark, invalid_argument("YAML: ", e.msg));
  }
}

Status apply_recipe_file(TrainRecipe* r, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("recipe: cannot open ", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return io_error("recipe: cannot read ", path);
  return apply_recipe_yaml(r, text.str(), path);
}

Status set_recipe_value(TrainRecipe* r, std::string_view key, std::string_view value) {
  RawValue raw;
  raw.scalar = std::string(trim(value));
  if (raw.scalar.size() >= 2 && raw.scalar.front() == '"' && raw.scalar.back() == '"') {
    auto decoded = decode_quoted(raw.scalar);
    if (!decoded.is_ok()) return decoded.status().with_context(std::string("key '") + std::string(key) + "'");
    raw.scalar = *decoded;
  }
  return set_raw(r, trim(key), raw);
}

Status apply_recipe_override(TrainRecipe* r, std::string_view key_equals_value) {
  const size_t eq = key_equals_value.find('=');
  if (eq == std::string_view::npos) {
    return invalid_argument("override '", key_equals_value, "' has no '='; write key=value, e.g. peft.dim=16");
  }
  return set_recipe_value(r, key_equals_value.substr(0, eq), key_equals_value.substr(eq + 1));
}

Result<TrainRecipe> load_recipe(const std::string& path, std::span<const std::string> overrides) {
  TrainRecipe r;
  if (!path.empty()) LATHE_TRY(apply_recipe_file(&r, path));
  for (const std::string& o : overrides) LATHE_TRY(apply_recipe_override(&r, o).with_context("command line"));
  return r;
}

const std::vector<RecipeKeyInfo>& recipe_keys() {
  static const std::vector<RecipeKeyInfo> keys = [] {
    std::vector<RecipeKeyInfo> out;
    const TrainRecipe defaults;
    for (const KeyDef& k : key_defs()) {
      std::string doc(k.doc);
      if (!k.choices.empty()) doc += " [" + k.choices + "]";
      out.push_back({std::string(k.name), std::string(k.type), k.render(defaults), doc});
    }
    return out;
  }();
  return keys;
}

Result<std::string> get_recipe_value(const TrainRecipe& r, std::string_view key) {
  const KeyDef* k = find_key(key);
  if (k == nullptr) return unknown_key(key);
  return k->render(r);
}

std::string render_recipe_help() {
  size_t w_name = 0, w_type = 0, w_def = 0;
  for (const RecipeKeyInfo& k : recipe_keys()) {
    w_name = std::max(w_name, k.name.size());
    w_type = std::max(w_type, k.type.size());
    w_def = std::max(w_def, std::min<size_t>(k.default_value.size(), 24));
  }
  std::string out = "Recipe keys (in a --recipe YAML file, or key=value on the command line):\n";
  std::string section;
  for (const RecipeKeyInfo& k : recipe_keys()) {
    const std::string sec = k.name.substr(0, k.name.find('.'));
    if (sec != section && !section.empty()) out += "\n";
    section = sec;
    auto pad = [](const std::string& s, size_t w) { return s + std::string(w > s.size() ? w - s.size() : 0, ' '); };
    out += "  " + pad(k.name, w_name) + "  " + pad(k.type, w_type) + "  ";
    if (k.default_value.size() > w_def) {  // a long default gets its own line
      out += k.default_value + "\n" + std::string(2 + w_name + 2 + w_type + 2 + w_def + 2, ' ');
    } else {
      out += pad(k.default_value, w_def) + "  ";
    }
    out += k.doc + "\n";
  }
  return out;
}

std::string recipe_to_yaml(const TrainRecipe& r) {
  std::string out = "# lathe training recipe: every key with its effective value\n";
  std::vector<std::string> open;  // sections currently open, outermost first
  for (const KeyDef& k : key_defs()) {
    std::vector<std::string> parts;
    std::string_view rest = k.name;
    for (size_t dot; (dot = rest.find('.')) != std::string_view::npos; rest.remove_prefix(dot + 1)) {
      parts.emplace_back(rest.substr(0, dot));
    }
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) ++common;
    open.resize(common);
    for (size_t d = common; d < parts.size(); ++d) {
      out += std::string(2 * d, ' ') + parts[d] + ":\n";
      open.push_back(parts[d]);
    }
    out += std::string(2 * parts.size(), ' ') + std::string(rest) + ": " + k.render(r) + "\n";
  }
  return out;
}

Status write_recipe_yaml(const TrainRecipe& r, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return io_error("recipe: cannot create ", tmp);
    f << recipe_to_yaml(r);
    f.flush();
    if (!f) return io_error("recipe: cannot write ", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return io_error("recipe: cannot rename ", tmp, " to ", path);
  return Status::ok();
}

}  // namespace lathe
