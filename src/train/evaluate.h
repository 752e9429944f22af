// Evaluation of a model (with or without an adapter) on a supervised data
// set: the mean loss over supervised tokens and its perplexity, and for
// {input, output} records, generation-based exact match and token F1 of
// greedy continuations against the reference output.
//
// Answers are compared after normalize_answer(): Unicode-aware lowercasing,
// punctuation stripped, whitespace collapsed and trimmed (scripts without
// case, such as Hangul, pass through unchanged). Token F1 counts the overlap
// of whitespace-separated tokens as SQuAD's evaluation does; articles are not
// removed (the data may be in any language).
//
// The loss is token-weighted: sum of −log p(target) over every supervised
// token of every record, divided by their count, the same quantity the
// trainer's validation loss reports.
//
// evaluate() runs on an EvalModel: the two things it asks of a model (the
// summed loss of one example, a greedy continuation) with one implementation
// per device side by side, the CPU's over CausalLM and the GPU's over
// CudaCausalLM (evaluate_cuda.cpp). The scoring is shared, so a number
// differs between devices only by what the model computes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "models/causal_lm.h"
#include "train/dataset.h"
#include "train/example.h"

namespace lathe {

// ---- Answer normalization and scores ------------------------------------
std::string normalize_answer(std::string_view text);
// 1 when the normalized strings are equal, else 0.
double exact_match_score(std::string_view prediction, std::string_view reference);
// F1 of the normalized whitespace tokens (multiset overlap). Both empty: 1;
// one empty: 0.
double token_f1_score(std::string_view prediction, std::string_view reference);

// ---- Records ---------------------------------------------------------------
// One record of the evaluation set. generation_context and reference are set
// for {input, output} records only: the context is the example's tokens before
// its first target (what training conditions the answer on), the reference the
// record's label field.
struct EvalRecord {
  Example example;
  std::optional<std::vector<int32_t>> generation_context;
  std::optional<std::string> reference;
  std::string prompt_text;  // for reports ("" for chat and pre-tokenized records)
};

// Reads a JSONL file into records (examples truncated to options.seq_length;
// records left without a target are skipped and counted in *n_dropped).
// Errors name file:line.
Result<std::vector<EvalRecord>> load_eval_records(const std::string& file, const DataOptions& options,
                                                  const TextCodec& codec, int64_t* n_dropped);

// ---- Evaluation --------------------------------------------------------
struct EvalOptions {
  int max_new_tokens = 64;           // generation budget per record
  std::vector<int32_t> stop_ids;     // end of generation (EOS and end-of-turn ids)
  bool generate = true;              // false: loss only
  // Text of generated ids (special tokens skipped). Required when generate.
  std::function<std::string(std::span<const int32_t>)> decode;
};

struct RecordResult {
  double loss = 0;        // mean over this record's targets
  int64_t n_targets = 0;
  std::optional<std::string> prediction;  // generated text, when generated
  double exact_match = 0;
  double f1 = 0;
};

struct EvalResult {
  double loss = 0;        // mean over all supervised tokens
  double perplexity = 0;  // exp(loss)
  std::optional<double> exact_match;  // mean over generated records; none without any
  std::optional<double> f1;
  int64_t n_records = 0;
  int64_t n_generated = 0;
  int64_t n_supervised_tokens = 0;
  std::vector<RecordResult> records;  // in input order
};

// Sum of −log softmax(logits[i−1])[ids[i]] over the targets of ex. logits:
// [n_tokens, vocab] f32 from a forward pass over ex.input_ids.
double example_nll_sum(const Example& ex, TensorView logits);
// The same sum over the targets that rows first .. first + rows − 1 of the
// logits predict: logits [rows, vocab] f32, row r the prediction after token
// first + r (so it scores ex.input_ids[first + r + 1]). Summing this over
// consecutive chunks of a pass gives example_nll_sum.
double example_nll_sum_rows(const Example& ex, TensorView logits, int64_t first);

// Greedy continuation of context: up to max_new_tokens ids, stopping after
// (and excluding) the first id in stop_ids.
Result<std::vector<int32_t>> greedy_generate(const CausalLM& model, std::span<const int32_t> context,
                                             int max_new_tokens, std::span<const int32_t> stop_ids);

// What evaluate() needs of a model, on whatever device holds it. One thread
// drives an EvalModel; each call starts a fresh sequence.
class EvalModel {
 public:
  virtual ~EvalModel() = default;
  virtual const ModelConfig& config() const = 0;
  virtual Device device() const = 0;
  // example_nll_sum of one forward pass over ex.input_ids.
  virtual Result<double> nll_sum(const Example& ex) = 0;
  // As greedy_generate().
  virtual Result<std::vector<int32_t>> greedy(std::span<const int32_t> context, int max_new_tokens,
                                              std::span<const int32_t> stop_ids) = 0;
};

// Borrows model for the EvalModel's lifetime.
std::unique_ptr<EvalModel> cpu_eval_model(const CausalLM& model);

// Loads model_dir (with adapter_dir merged when not empty) onto CUDA device
// `device` in bf16, sized for records: the KV cache holds the longest record
// or generation context + max_new_tokens (capped at the model's context); the
// loss runs in chunks of at most chunk_tokens, whose logits come to the host.
// Errors as CudaCausalLM::load (kUnsupported without CUDA or a GPU).
struct CudaEvalOptions {
  std::string model_dir;
  std::string adapter_dir;
  int device = 0;
  int max_new_tokens = 64;
  int chunk_tokens = 256;
};
Result<std::unique_ptr<EvalModel>> cuda_eval_model(const CudaEvalOptions& options, std::span<const EvalRecord> records);

// Runs every record through model (borrowed for the call). Single caller.
Result<EvalResult> evaluate(EvalModel& model, std::span<const EvalRecord> records, const EvalOptions& options);
// The CPU model; its forward uses the process's threads.
Result<EvalResult> evaluate(const CausalLM& model, std::span<const EvalRecord> records, const EvalOptions& options);

// {"loss":..,"perplexity":..,"exact_match":..,"f1":..,"n_records":..}
// (exact_match and f1 null when nothing was generated).
std::string eval_result_json(const EvalResult& r);

}  // namespace lathe
