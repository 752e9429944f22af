// Placeholder until `lathe tokenize` lands: registers nothing.
#include "cli/commands.h"
namespace lathe::cli {
void add_tokenize(CLI::App&, int*) {}
}  // namespace lathe::cli
