// Entry point of the `alloy` binary: subcommand dispatch and the one place errors are printed.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "cli/commands.hpp"
#include "spec/error.hpp"

namespace {
// OpenMP's default spin-waiting lets idle threads steal the cores that several ranks (or other
// programs) share on one machine; libgomp reads the policy only at start-up, so the binary
// restarts itself once with a passive policy unless the user chose one.
void ensure_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);  // returns only on failure; then run as we are
}
}  // namespace

int main(int argc, char** argv) {
  ensure_passive_openmp_wait(argv);
  CLI::App app{"alloy: plan, simulate and run hybrid-parallel transformer training on heterogeneous clusters"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Print help for every subcommand");
  int exit_code = 0;
  alloy::cli::add_check(app, &exit_code);
  alloy::cli::add_plan(app, &exit_code);
  alloy::cli::add_explain(app, &exit_code);
  alloy::cli::add_replan(app, &exit_code);
  alloy::cli::add_run(app, &exit_code);
  alloy::cli::add_import_hf(app, &exit_code);
  alloy::cli::add_export_hf(app, &exit_code);
  alloy::cli::add_simulate(app, &exit_code);
  alloy::cli::add_report(app, &exit_code);
  alloy::cli::add_train(app, &exit_code);
  alloy::cli::add_comm_check(app, &exit_code);
  alloy::cli::add_tokenize(app, &exit_code);
  alloy::cli::add_profile(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // CLI11's message names the option and, for checked values, the accepted range.
    const std::string command = app.get_subcommands().empty() ? "" : app.get_subcommands().front()->get_name() + " ";
    fmt::print(stderr, "alloy: error: {}\n  fix: see `alloy {}--help` for the accepted values\n", e.what(), command);
    return alloy::kExitBadInput;
  } catch (const alloy::Error& e) {
    fmt::print(stderr, "alloy: error: {}\n", e.format());
    return alloy::kExitBadInput;
  } catch (const std::exception& e) {
    fmt::print(stderr, "alloy: internal error: {}\n  please report this with the command that caused it\n", e.what());
    return 1;
  }
  return exit_code;
}
