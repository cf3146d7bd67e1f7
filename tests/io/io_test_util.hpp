// Shared helpers for the runtime I/O tests: a scratch directory per test, raw file writes, and
// assertions that a call fails with an alloy::Error naming the right file and field.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "spec/error.hpp"

namespace alloy::test {

// A fresh directory for one test, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("alloy_io_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void bytes_write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string bytes_read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs `call`, which must throw alloy::Error; returns the error (a default one on failure).
template <typename Call>
Error error_of(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-alloy exception: " << e.what();
    return Error("wrong exception type");
  }
  ADD_FAILURE() << "no error thrown";
  return Error("no error thrown");
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace alloy::test

// The error's message contains `part`; prints the whole error on failure.
#define EXPECT_ERROR_SAYS(error, part) EXPECT_TRUE(::alloy::test::contains((error).message(), part)) << (error).format()
