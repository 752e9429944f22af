// Unicode class additions for tokenizer regexes. tokenizer.json patterns are
// matched by the reference library with a newer Unicode version than the
// system PCRE2 carries; these generated ranges (tools/make_unicode_tables.py)
// widen \p{L}, \p{N}, \p{M} and their subcategories to the same members.
#pragma once

#include <cstddef>

namespace lathe::tok {

struct UnicodeClassExtra {
  const char* property;  // "L", "Lu", "N", ...
  const char* ranges;    // PCRE2 class body, e.g. "\\x{31350}-\\x{323AF}"
};

extern const UnicodeClassExtra kUnicodeClassExtras[];
extern const size_t kNumUnicodeClassExtras;

}  // namespace lathe::tok
