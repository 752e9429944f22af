// Placeholder until `lathe logits` lands: registers nothing.
#include "cli/commands.h"
namespace lathe::cli {
void add_logits(CLI::App&, int*) {}
}  // namespace lathe::cli
