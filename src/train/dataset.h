// Supervised fine-tuning data sets: JSONL files in NeMo's layout (a directory
// holding training.jsonl, validation.jsonl, test.jsonl) or single files,
// read whole and tokenized up front (in parallel) into Examples, with the
// truncation policy applied and everything counted, so the trainer can print
// what it is about to train on before the first step.
//
// Truncation policy (data.truncation):
//   right (default): an example longer than seq_length keeps its first
//     seq_length tokens; if none of its targets survive, it is dropped.
//   drop: an example longer than seq_length is dropped.
// Examples without any target (a chat with no assistant turn) are dropped too.
// Dropped examples are counted and reported with a warning, never silent.
//
// Bad records (malformed JSON, missing fields, wrong types, mask length
// mismatch, ids outside the vocabulary) stop the load with "file:line: reason"
// unless data.on_error=skip, which skips them and counts them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "train/example.h"

namespace lathe {

enum class Truncation : uint8_t { kRight, kDrop };
enum class OnError : uint8_t { kStop, kSkip };
Result<Truncation> parse_truncation(std::string_view s);  // "right" | "drop"
Result<OnError> parse_on_error(std::string_view s);       // "stop" | "skip"

struct DataOptions {
  std::string prompt_template = "{input} {output}";  // data.prompt_template
  std::string label_key = "output";                  // data.label_key: the supervised field
  int32_t seq_length = 2048;                         // data.seq_length: tokens per row
  Truncation truncation = Truncation::kRight;        // data.truncation
  OnError on_error = OnError::kStop;                 // data.on_error
  Status validate() const;
};

enum class Split : uint8_t { kTrain, kValidation, kTest };
const char* split_file_name(Split split);  // "training.jsonl", "validation.jsonl", "test.jsonl"

// path: a directory in NeMo's layout, or a single JSONL file (which is the
// training split; the other splits are then absent). Returns the file of the
// split, std::nullopt when the directory has none for validation or test;
// a directory without training.jsonl or a missing path is an error.
Result<std::optional<std::string>> find_split_file(const std::string& path, Split split);

struct DatasetStats {
  int64_t n_records = 0;            // non-blank lines read
  int64_t n_examples = 0;           // examples kept
  int64_t n_skipped = 0;            // malformed records skipped (on_error=skip)
  int64_t n_truncated = 0;          // examples cut to seq_length (truncation=right)
  int64_t n_dropped_too_long = 0;   // longer than seq_length with no target left, or truncation=drop
  int64_t n_dropped_no_target = 0;  // no supervised token at all
  int64_t n_tokens = 0;             // tokens of the kept examples, after truncation
  int64_t n_supervised_tokens = 0;  // targets of the kept examples
  int64_t max_tokens = 0;           // longest kept example
  std::vector<std::string> first_errors;  // up to kMaxErrors "file:line: reason" of skipped records

  static constexpr size_t kMaxErrors = 5;
  void merge(const DatasetStats& other);
};
// One line for the log: "30 records -> 30 examples, 1234 tokens (456 supervised), ..."
std::string describe(const DatasetStats& stats);

struct SftDataset {
  std::vector<Example> examples;
  std::vector<std::string> files;
  DatasetStats stats;
};

// Builds one example from one JSONL line (no truncation). Errors carry the
// reason only; the caller adds file:line.
Result<Example> example_from_line(std::string_view line, const PromptTemplate& prompt, const TextCodec& codec);

// Reads and tokenizes files in order. codec is borrowed for the call; its
// functions run on several threads.
Result<SftDataset> load_sft_dataset(std::span<const std::string> files, const DataOptions& options,
                                    const TextCodec& codec);

// Statistics of a data set without keeping its examples (same counting as
// load_sft_dataset; the trainer prints them for validation and test splits).
Result<DatasetStats> dataset_stats(std::span<const std::string> files, const DataOptions& options,
                                   const TextCodec& codec);

}  // namespace lathe
