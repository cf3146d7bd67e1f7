// Whole-file and appending writes with every failure reported (see text_file.hpp).
#include "spec/text_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "spec/error.hpp"

namespace alloy {

namespace {

[[noreturn]] void write_fail(const std::string& path, const std::string& flag, const std::string& what, int errno_value) {
  throw Error(what + ": " + std::strerror(errno_value), {path, flag},
              "check that the folder exists, is writable and has free space");
}

}  // namespace

void text_fd_append(int fd, const std::string& path, const std::string& text, const std::string& what,
                    const std::string& flag) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) write_fail(path, flag, "writing the " + what + " failed", n < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(n);
  }
}

void text_file_write(const std::string& path, const std::string& text, const std::string& what, const std::string& flag) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) write_fail(path, flag, "cannot create the " + what, errno);
  try {
    text_fd_append(fd, path, text, what, flag);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) write_fail(path, flag, "closing the " + what + " failed", errno);
}

}  // namespace alloy
