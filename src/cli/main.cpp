#include "cli/commands.h"

int main(int argc, char** argv) { return lathe::cli::run(argc, argv); }
