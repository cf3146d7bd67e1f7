// The alloy subcommands: each registers its options on the CLI11 app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

namespace alloy::cli {

// Each `add_*` registers a subcommand; the callback it installs runs the command and throws
// alloy::Error for bad input. `exit_code` receives the command's exit status.
void add_check(CLI::App& app, int* exit_code);
void add_plan(CLI::App& app, int* exit_code);
void add_explain(CLI::App& app, int* exit_code);
void add_replan(CLI::App& app, int* exit_code);
void add_run(CLI::App& app, int* exit_code);
void add_import_hf(CLI::App& app, int* exit_code);
void add_export_hf(CLI::App& app, int* exit_code);
void add_simulate(CLI::App& app, int* exit_code);
void add_report(CLI::App& app, int* exit_code);
void add_train(CLI::App& app, int* exit_code);
void add_comm_check(CLI::App& app, int* exit_code);
void add_tokenize(CLI::App& app, int* exit_code);
void add_profile(CLI::App& app, int* exit_code);

}  // namespace alloy::cli
