// Placeholder until `lathe detokenize` lands: registers nothing.
#include "cli/commands.h"
namespace lathe::cli {
void add_detokenize(CLI::App&, int*) {}
}  // namespace lathe::cli
