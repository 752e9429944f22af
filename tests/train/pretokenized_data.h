// Synthetic pre-tokenized training data for trainer tests: short documents
// of ids with a repeating pattern each (ids 3..302), the second half of each
// supervised. Shared by the CPU and GPU trainer tests so both train on the
// very same records.
#pragma once

#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace lathe {

// n_records JSONL lines {"input_ids": [...], "loss_mask": [...]}; salt varies
// the lengths and ids (a validation set uses another salt than training).
inline std::string pretokenized_jsonl(int n_records, int salt) {
  std::ostringstream os;
  for (int r = 0; r < n_records; ++r) {
    nlohmann::json ids = nlohmann::json::array(), mask = nlohmann::json::array();
    const int len = 12 + (r * 5 + salt) % 9;
    for (int i = 0; i < len; ++i) {
      ids.push_back(3 + (r * 7 + i * (r % 3 + 1) + salt) % 300);
      mask.push_back(i >= len / 2 ? 1 : 0);
    }
    os << nlohmann::json{{"input_ids", ids}, {"loss_mask", mask}}.dump() << "\n";
  }
  return os.str();
}

}  // namespace lathe
