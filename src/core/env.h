// Every environment variable lathe reads, in one place: name, default, doc.
#pragma once

#include <string>

namespace lathe::env {

// LATHE_LOG_LEVEL: debug | info | warn | error | off. Default: info.
std::string log_level();
// LATHE_NUM_THREADS: CPU threads for compute. Default: OMP_NUM_THREADS, else all cores.
int num_threads();

// Reads a variable; returns fallback when unset or empty.
std::string get(const char* name, const std::string& fallback = "");

}  // namespace lathe::env
