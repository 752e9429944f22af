// Subcommands whose implementation has not landed yet register nothing.
#include "cli/commands.h"
namespace lathe::cli {
void add_tokenize(CLI::App&, int*) {}
void add_detokenize(CLI::App&, int*) {}
void add_chat_template(CLI::App&, int*) {}
void add_inspect(CLI::App&, int*) {}
void add_init_model(CLI::App&, int*) {}
void add_generate(CLI::App&, int*) {}
void add_logits(CLI::App&, int*) {}
}  // namespace lathe::cli
