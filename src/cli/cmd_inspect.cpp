// Placeholder until `lathe inspect` lands: registers nothing.
#include "cli/commands.h"
namespace lathe::cli {
void add_inspect(CLI::App&, int*) {}
}  // namespace lathe::cli
