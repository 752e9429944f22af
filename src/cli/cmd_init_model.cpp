// Placeholder until `lathe init-model` lands: registers nothing.
#include "cli/commands.h"
namespace lathe::cli {
void add_init_model(CLI::App&, int*) {}
}  // namespace lathe::cli
