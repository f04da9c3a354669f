// The `seqpar` command-line tool: subcommands for running, checking and measuring the
// distributed attention algorithms.
#include <CLI/CLI.hpp>

#include "attn_command.hpp"
#include "linear_attn_command.hpp"
#include "plan_command.hpp"
#include "probe_command.hpp"
#include "train_command.hpp"

int main(int argc, char** argv) {
  CLI::App app{"seqpar: exact attention over very long sequences split across ranks"};
  app.require_subcommand(1);
  seqpar::app::AttnOptions attn_options;
  int exit_code = 0;
  seqpar::app::add_attn_command(app, attn_options, &exit_code);
  seqpar::app::LinearAttnOptions linear_attn_options;
  seqpar::app::add_linear_attn_command(app, linear_attn_options, &exit_code);
  seqpar::app::PlanCliOptions plan_options;
  seqpar::app::add_plan_command(app, plan_options, &exit_code);
  seqpar::app::ProbeCliOptions probe_options;
  seqpar::app::add_probe_command(app, probe_options, &exit_code);
#ifdef SEQPAR_HAVE_MODEL
  seqpar::app::TrainCliOptions train_options;
  seqpar::app::add_train_command(app, train_options, &exit_code);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help and the like
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints what was wrong and the usage
    return 2;     // the README's code for bad arguments, whatever CLI11 numbers the error
  }
  return exit_code;
}
