// Feeds thousands of random corruptions of the shipped example files to the loaders: each must
// load or end in an alloy::Error; any other exception, crash or sanitizer report fails the test.
// ALLOY_MUTATIONS and ALLOY_MUTATION_SEED override the count and seed.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "../common/test_util.hpp"
#include "hw/catalog.hpp"
#include "spec/cluster.hpp"
#include "spec/error.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {
namespace {

namespace fs = std::filesystem;

struct Sample {
  std::string kind;  // models, clusters, train
  std::string extension;
  std::string text;
};

std::vector<Sample> load_samples() {
  std::vector<Sample> out;
  for (const char* kind : {"models", "clusters", "train"}) {
    for (const auto& entry : fs::directory_iterator(std::string(ALLOY_SOURCE_DIR) + "/examples/" + kind)) {
      out.push_back({kind, entry.path().extension().string(), testing::read_text(entry.path().string())});
    }
  }
  return out;
}

std::string mutate(std::string text, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  static const char* kTokens[] = {"0", "-1", "99999999999999999999", "1e308", "nan", "", "abc", "3.5", ":", "- ",
                                  "{", "}", "[", "]", "\"", "&a ", "*a", "!!binary ", "null", "\t", "\n", ",", "#",
                                  "-0", "0x10", "1e-400", "true", "~", "'", "\\u0000", "\xff\xfe"};
  const int ops = 1 + static_cast<int>(pick(3));
  for (int op = 0; op < ops; ++op) {
    size_t at = pick(text.size() + 1);
    switch (pick(7)) {
      case 0:  // flip a byte
        if (!text.empty()) text[pick(text.size())] = static_cast<char>(rng() & 0xff);
        break;
      case 1:  // delete a range
        text.erase(at, pick(40));
        break;
      case 2:  // insert a token
        text.insert(at, kTokens[pick(std::size(kTokens))]);
        break;
      case 3: {  // replace a number with a token
        size_t digit = text.find_first_of("0123456789", at);
        if (digit != std::string::npos) {
          size_t end = text.find_first_not_of("0123456789.eE-+", digit);
          text.replace(digit, (end == std::string::npos ? text.size() : end) - digit, kTokens[pick(12)]);
        }
        break;
      }
      case 4: {  // duplicate a line
        size_t begin = text.rfind('\n', at);
        begin = begin == std::string::npos ? 0 : begin + 1;
        size_t end = text.find('\n', begin);
        std::string line = text.substr(begin, end == std::string::npos ? std::string::npos : end - begin + 1);
        text.insert(begin, line);
        break;
      }
      case 5:  // truncate
        text.resize(at);
        break;
      default: {  // delete a line
        size_t begin = text.rfind('\n', at);
        begin = begin == std::string::npos ? 0 : begin + 1;
        size_t end = text.find('\n', begin);
        text.erase(begin, end == std::string::npos ? std::string::npos : end - begin + 1);
        break;
      }
    }
  }
  return text;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

TEST(SpecMutation, CorruptedExamplesEndInCleanErrors) {
  const std::vector<Sample> samples = load_samples();
  ASSERT_FALSE(samples.empty());
  const int count = env_int("ALLOY_MUTATIONS", 3000);
  std::mt19937_64 rng(static_cast<uint64_t>(env_int("ALLOY_MUTATION_SEED", 20261129)));
  testing::TempDir dir;
  int loaded = 0, rejected = 0;
  for (int i = 0; i < count; ++i) {
    const Sample& sample = samples[rng() % samples.size()];
    std::string text = mutate(sample.text, rng);
    std::string path = dir.write("input" + sample.extension, text);
    try {
      if (sample.kind == "models") {
        model_load_file(path);
      } else if (sample.kind == "clusters") {
        cluster_load(path, catalog_builtin());
      } else {
        train_load(path);
      }
      ++loaded;
    } catch (const Error& e) {
      ++rejected;
      ASSERT_FALSE(e.message().empty());
      ASSERT_EQ(e.where().file, path) << e.format();
    } catch (const std::exception& e) {
      FAIL() << "mutation " << i << " escaped as " << typeid(e).name() << ": " << e.what() << "\n--- input ---\n" << text;
    }
  }
  std::printf("mutations: %d, loaded: %d, rejected with a clear error: %d\n", count, loaded, rejected);
  EXPECT_GT(rejected, count / 4);
}

}  // namespace
}  // namespace alloy
