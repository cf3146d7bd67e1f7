// Writing a whole output file (plan, trace, report, profile) so that a failed write, flush or
// close is an alloy::Error with the path and the system's reason, never a file cut short in silence.
#pragma once

#include <string>

namespace alloy {

// Replaces `path` with `text`; `what` names the file in errors ("plan file", "trace") and `flag`
// the option that chose the path ("--output"; may be empty).
void text_file_write(const std::string& path, const std::string& text, const std::string& what,
                     const std::string& flag = {});

// Appends `text` to the open descriptor `fd` of `path` in full, retrying short writes; an error
// names the path and the reason.
void text_fd_append(int fd, const std::string& path, const std::string& text, const std::string& what,
                    const std::string& flag = {});

}  // namespace alloy
