// Read-only memory maps, atomic writes and checksums for runtime I/O (see file_io.hpp).
#include "runtime/io/file_io.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <filesystem>

#include "spec/error.hpp"

namespace alloy {

static_assert(std::endian::native == std::endian::little, "crc32_update loads little-endian words");

namespace {
// Writes of at least this many bytes checksum on a second thread.
constexpr std::size_t kChecksumThreadBytes = std::size_t{1} << 20;

std::string errno_text(int errno_value) { return std::strerror(errno_value); }
}  // namespace

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_bytes_(other.size_bytes_) {
  other.data_ = nullptr;
  other.size_bytes_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(const_cast<std::byte*>(data_), size_bytes_);
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_bytes_ = other.size_bytes_;
    other.data_ = nullptr;
    other.size_bytes_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<std::byte*>(data_), size_bytes_);
}

namespace {

// Opens `path` read-only and returns its descriptor and size; the error names what is wrong.
int file_open_for_reading(const std::string& path, const std::string& what, std::uint64_t* size_bytes) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw Error(what + " not found", io_where(path), "check the path");
  }
  if (std::filesystem::is_directory(path, ec)) {
    throw Error(what + " is a directory, expected a file", io_where(path), "pass the path of the file itself");
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw Error("cannot open " + what + ": " + errno_text(errno), io_where(path), "check the file's permissions");
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    int saved = errno;
    ::close(fd);
    throw Error("cannot stat " + what + ": " + errno_text(saved), io_where(path));
  }
  *size_bytes = static_cast<std::uint64_t>(info.st_size);
  return fd;
}

}  // namespace

MappedFile mapped_file_open(const std::string& path, const std::string& what) {
  std::uint64_t size_bytes = 0;
  const int fd = file_open_for_reading(path, what, &size_bytes);
  MappedFile mapped;
  mapped.path_ = path;
  mapped.size_bytes_ = static_cast<std::size_t>(size_bytes);
  if (mapped.size_bytes_ > 0) {
    void* address = mmap(nullptr, mapped.size_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (address == MAP_FAILED) {
      int saved = errno;
      ::close(fd);
      mapped.size_bytes_ = 0;
      throw Error("cannot map " + what + ": " + errno_text(saved), io_where(path));
    }
    mapped.data_ = static_cast<const std::byte*>(address);
  }
  ::close(fd);
  return mapped;
}

ReadFile::ReadFile(ReadFile&& other) noexcept
    : path_(std::move(other.path_)), what_(std::move(other.what_)), fd_(other.fd_), size_bytes_(other.size_bytes_) {
  other.fd_ = -1;
  other.size_bytes_ = 0;
}

ReadFile& ReadFile::operator=(ReadFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    what_ = std::move(other.what_);
    fd_ = other.fd_;
    size_bytes_ = other.size_bytes_;
    other.fd_ = -1;
    other.size_bytes_ = 0;
  }
  return *this;
}

ReadFile::~ReadFile() {
  if (fd_ >= 0) ::close(fd_);
}

ReadFile read_file_open(const std::string& path, const std::string& what) {
  ReadFile file;
  file.fd_ = file_open_for_reading(path, what, &file.size_bytes_);
  file.path_ = path;
  file.what_ = what;
  return file;
}

void ReadFile::read_at(std::uint64_t offset_bytes, std::span<std::byte> out) const {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset_bytes + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error("reading the " + what_ + " failed: " + errno_text(errno), io_where(path_), "check the file and the disk");
    if (n == 0) {
      throw Error("the " + what_ + " shrank while in use: bytes " + std::to_string(offset_bytes + done) + " to " +
                      std::to_string(offset_bytes + out.size()) + " are gone (it had " + std::to_string(size_bytes_) +
                      " bytes when opened)",
                  io_where(path_), "do not rewrite or truncate a file while a run reads it; restore it and resume");
    }
    done += static_cast<std::size_t>(n);
  }
}

FileWriter::FileWriter(const std::string& path, std::int64_t fault_after_bytes)
    : path_(path), fault_after_bytes_(fault_after_bytes) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create file", errno);
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::fail(const std::string& what, int errno_value) {
  throw Error(what + ": " + errno_text(errno_value), io_where(path_),
              "check free disk space and write permission of the directory");
}

void FileWriter::write(const void* data, std::size_t count_bytes) {
  const auto* bytes = static_cast<const std::byte*>(data);
  // A large write's checksum runs on other threads beside the write(2) calls, which read the same
  // bytes: the save then takes the longer of the two, not their sum (io_bench).
  const std::uint32_t before = checksum_;
  std::future<std::uint32_t> checksum;
  if (count_bytes >= kChecksumThreadBytes) {
    checksum = std::async(std::launch::async,
                          [before, bytes, count_bytes] { return crc32_update_parallel(before, {bytes, count_bytes}); });
  } else {
    checksum_ = crc32_update(before, {bytes, count_bytes});
  }
  struct Join {  // the thread reads `data`: it must end before this call returns, even by an exception
    std::future<std::uint32_t>& f;
    ~Join() {
      if (f.valid()) f.wait();
    }
  } join{checksum};
  std::size_t done = 0;
  while (done < count_bytes) {
    std::size_t chunk = count_bytes - done;
    if (fault_after_bytes_ >= 0) {
      auto budget = static_cast<std::uint64_t>(fault_after_bytes_);
      if (written_bytes_ >= budget) fail("write failed", ENOSPC);
      chunk = std::min<std::size_t>(chunk, budget - written_bytes_);
    }
    ssize_t n = ::write(fd_, bytes + done, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write failed", errno);
    }
    done += static_cast<std::size_t>(n);
    written_bytes_ += static_cast<std::uint64_t>(n);
  }
  if (checksum.valid()) checksum_ = checksum.get();
}

void FileWriter::patch(std::size_t offset_bytes, const void* data, std::size_t count_bytes) {
  ssize_t n = ::pwrite(fd_, data, count_bytes, static_cast<off_t>(offset_bytes));
  if (n < 0 || static_cast<std::size_t>(n) != count_bytes) fail("write failed", errno);
}

void FileWriter::close_synced() {
  if (fsync(fd_) != 0) fail("fsync failed", errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close failed", errno);
}

void directory_sync(const std::string& path) {
  int fd = ::open(path.empty() ? "." : path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some file systems refuse to open directories
  fsync(fd);
  ::close(fd);
}

void file_replace_check(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::symlink_status(path, ec);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw Error("exists and is not a regular file: writing it atomically would replace it", io_where(path),
                "name a new file or a regular file to overwrite");
  }
}

void file_write_atomic(const std::string& path, const std::function<void(FileWriter&)>& write_body) {
  file_replace_check(path);
  std::filesystem::path target(path);
  std::string temp = path + ".tmp-" + std::to_string(getpid());
  try {
    FileWriter writer(temp);
    write_body(writer);
    writer.close_synced();
    if (std::rename(temp.c_str(), path.c_str()) != 0) {
      throw Error("cannot rename " + temp + " into place: " + errno_text(errno), io_where(path));
    }
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(temp, ec);
    throw;
  }
  directory_sync(target.parent_path().string());
}

std::string checksum_hex(std::uint32_t checksum) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", checksum);
  return text;
}

}  // namespace alloy
