// lathe subcommands. Each cmd_*.cpp defines one add_*() that registers its
// subcommand, flags and callback on the app; the callback stores the process
// exit code in *rc. Commands are thin: parse flags, call the library, print.
#pragma once

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace lathe::cli {

// Prints "lathe <command>: <message>" to stderr and returns the exit code for s
// (0 when ok, 2 for invalid input, 1 otherwise).
int report(const char* command, const Status& s);

// --device: "cpu", "cuda" or "cuda:N"; "auto" is cuda:0 when this build has
// CUDA and a GPU is visible, else cpu. Naming a CUDA device that is not there
// is an error saying what is missing.
Result<Device> parse_device(const std::string& flag);

void add_version(CLI::App& app, int* rc);
void add_tokenize(CLI::App& app, int* rc);
void add_detokenize(CLI::App& app, int* rc);
void add_chat_template(CLI::App& app, int* rc);
void add_inspect(CLI::App& app, int* rc);
void add_init_model(CLI::App& app, int* rc);
void add_generate(CLI::App& app, int* rc);
void add_logits(CLI::App& app, int* rc);
void add_eval(CLI::App& app, int* rc);
void add_finetune(CLI::App& app, int* rc);
void add_export(CLI::App& app, int* rc);
void add_checkpoint(CLI::App& app, int* rc);

// Entry point for main(): builds the app, parses, runs; returns the exit code.
int run(int argc, char** argv);

}  // namespace lathe::cli
