// Starts tests/io/s3_server.py (moto's S3 server with signature checks, and
// a fault-injecting proxy in front of it, on 127.0.0.1) for the S3 tests, and
// talks to it over its stdin/stdout. One server per test process; it exits
// when the process does (its stdin closes).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

namespace lathe::testing {

class S3TestServer {
 public:
  std::string endpoint;  // moto itself
  std::string proxy;     // the fault-injecting proxy
  std::string access_key, secret_key, bucket;
  std::string skip_reason;  // non-empty: moto is not installed

  // Starts the server, or returns the reason it could not start.
  static S3TestServer* instance(std::string* error) {
    static S3TestServer* server = nullptr;
    static std::string start_error;
    if (!server && start_error.empty()) {
      auto* s = new S3TestServer();
      start_error = s->start();
      if (start_error.empty()) server = s;
      else delete s;
    }
    *error = start_error;
    return server;
  }

  // Sends one command line; returns the server's one-line answer.
  std::string command(const std::string& line) {
    std::string out = line + "\n";
    if (::write(to_child_, out.data(), out.size()) != static_cast<ssize_t>(out.size())) return "error: write";
    return read_line(10000);
  }

 private:
  std::string start() {
    int in_pipe[2], out_pipe[2];
    if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0) return "pipe failed";
    const std::string script = std::string(LATHE_SOURCE_DIR) + "/tests/io/s3_server.py";
    pid_ = fork();
    if (pid_ < 0) return "fork failed";
    if (pid_ == 0) {
      dup2(in_pipe[0], 0);
      dup2(out_pipe[1], 1);
      execlp("python3", "python3", script.c_str(), "--stall-s", "3", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(in_pipe[0]);
    close(out_pipe[1]);
    to_child_ = in_pipe[1];
    from_child_ = out_pipe[0];
    signal(SIGPIPE, SIG_IGN);
    std::string line = read_line(60000);
    if (line.rfind("skip:", 0) == 0) {
      skip_reason = line;
      return "";
    }
    try {
      nlohmann::json j = nlohmann::json::parse(line);
      endpoint = j.at("endpoint");
      proxy = j.at("proxy");
      access_key = j.at("access_key");
      secret_key = j.at("secret_key");
      bucket = j.at("bucket");
    } catch (const std::exception& e) {
      return "tests/io/s3_server.py did not start: '" + line + "'";
    }
    return "";
  }

  std::string read_line(int timeout_ms) {
    std::string line;
    char c;
    while (true) {
      pollfd p{.fd = from_child_, .events = POLLIN, .revents = 0};
      if (poll(&p, 1, timeout_ms) <= 0) return line.empty() ? "error: no answer" : line;
      if (::read(from_child_, &c, 1) != 1) return line;
      if (c == '\n') return line;
      line += c;
    }
  }

  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
};

}  // namespace lathe::testing
