// Subcommands whose issue has not landed yet: they answer --help and say plainly they are missing.
#include <fmt/core.h>

#include "cli/commands.hpp"

namespace alloy::cli {

void add_unbuilt(CLI::App& app, const char* name, const char* summary, const char* issue, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(name, std::string(summary) + " (not built yet)");
  cmd->allow_extras();
  std::string command = name;
  std::string issue_ref = issue;
  cmd->callback([command, issue_ref, exit_code]() {
    fmt::print(stderr,
               "alloy {}: this command is not built yet (tracked in issue {}).\n"
               "  what works today: `alloy check --model M --cluster C`; see README.md's status table.\n",
               command, issue_ref);
    *exit_code = 3;
  });
}

}  // namespace alloy::cli
