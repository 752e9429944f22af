// The lathe command line: one app, one subcommand per cmd_*.cpp.
#include <cstdio>

#include "cli/commands.h"
#include "core/parallel.h"

namespace lathe::cli {

int report(const char* command, const Status& s) {
  if (s.is_ok()) return 0;
  std::fprintf(stderr, "lathe %s: %s\n", command, s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kNotFound ? 2 : 1;
}

void add_version(CLI::App& app, int* rc) {
  auto* cmd = app.add_subcommand("version", "Print lathe's version and build features");
  cmd->callback([rc] {
    std::printf("lathe 0.1.0\n");
    *rc = 0;
  });
}

int run(int argc, char** argv) {
  init_threads();
  CLI::App app{"lathe: fine-tune, evaluate, export and serve Llama-family models"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Print help for every subcommand");
  int rc = 0;
  add_version(app, &rc);
  add_tokenize(app, &rc);
  add_detokenize(app, &rc);
  add_chat_template(app, &rc);
  add_inspect(app, &rc);
  add_init_model(app, &rc);
  add_generate(app, &rc);
  add_logits(app, &rc);
  add_eval(app, &rc);
  add_finetune(app, &rc);
  add_export(app, &rc);
  add_checkpoint(app, &rc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return rc;
}

}  // namespace lathe::cli
