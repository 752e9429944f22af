// Placeholder until `lathe chat-template` lands: registers nothing.
#include "cli/commands.h"
namespace lathe::cli {
void add_chat_template(CLI::App&, int*) {}
}  // namespace lathe::cli
