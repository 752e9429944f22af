// Placeholder until `lathe generate` lands: registers nothing.
#include "cli/commands.h"
namespace lathe::cli {
void add_generate(CLI::App&, int*) {}
}  // namespace lathe::cli
