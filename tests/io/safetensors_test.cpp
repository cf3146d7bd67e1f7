// safetensors: round trips, the exact byte layout, PyTorch interop, and one error per defect.
#include "runtime/io/safetensors.hpp"

#include <cstdlib>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "io_test_util.hpp"

namespace alloy {
namespace {

using test::error_of;

struct Tensors {
  std::vector<float> storage;
  std::vector<TensorRef> views;
};

// Three tensors in one flat buffer, as the runtime lays them out: (3, 4), (5), ().
Tensors sample_tensors() {
  Tensors t;
  t.storage.resize(12 + 5 + 1);
  for (std::size_t i = 0; i < t.storage.size(); ++i) t.storage[i] = 0.5f * i - 3.25f + 1e-7f * i * i;
  t.views = {{"wte.weight", {3, 4}, t.storage.data()},
             {"ln_f.bias", {5}, t.storage.data() + 12},
             {"scale", {}, t.storage.data() + 17}};
  return t;
}

// An 8-byte length, `header` verbatim, then `data_bytes` zero bytes.
void raw_file_write(const std::string& path, const std::string& header, std::size_t data_bytes) {
  std::uint64_t length = header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &length, 8);
  test::bytes_write(path, bytes + header + std::string(data_bytes, '\0'));
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  test::ScratchDir dir;
  Tensors in = sample_tensors();
  safetensors_save(dir.file("m.safetensors"), in.views, {{"step", "12"}, {"model", "tiny"}});
  SafetensorsFile file = safetensors_open(dir.file("m.safetensors"));
  EXPECT_EQ(file.metadata().at("step"), "12");
  EXPECT_EQ(file.metadata().at("model"), "tiny");
  ASSERT_EQ(file.entries().size(), 3u);
  EXPECT_EQ(file.entry_find("wte.weight")->shape, (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(file.entry_find("nope"), nullptr);
  std::vector<float> out(in.storage.size(), -1.0f);
  Tensors target = sample_tensors();
  for (auto& view : target.views) view.data = out.data() + (view.data - target.storage.data());
  safetensors_read_into(file, target.views);
  EXPECT_EQ(out, in.storage);
}

TEST(Safetensors, ByteLayoutFollowsTheFormat) {
  test::ScratchDir dir;
  Tensors in = sample_tensors();
  safetensors_save(dir.file("m.safetensors"), in.views, {});
  std::string bytes = test::bytes_read(dir.file("m.safetensors"));
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  EXPECT_EQ((8 + header_bytes) % 8, 0u) << "tensor data should start 8-byte aligned";
  auto header = nlohmann::json::parse(bytes.substr(8, header_bytes));
  EXPECT_FALSE(header.contains("__metadata__"));
  std::uint64_t data_begin = 8 + header_bytes;
  EXPECT_EQ(bytes.size() - data_begin, in.storage.size() * 4);
  for (const auto& view : in.views) {
    const auto& entry = header.at(view.name);
    EXPECT_EQ(entry.at("dtype"), "F32");
    EXPECT_EQ(entry.at("shape").get<std::vector<std::int64_t>>(), view.shape);
    auto begin = entry.at("data_offsets")[0].get<std::uint64_t>();
    auto end = entry.at("data_offsets")[1].get<std::uint64_t>();
    auto numel = static_cast<std::uint64_t>(tensor_ref_numel(view));
    ASSERT_EQ(end - begin, numel * 4);
    EXPECT_EQ(std::memcmp(bytes.data() + data_begin + begin, view.data, numel * 4), 0) << view.name;
  }
}

TEST(Safetensors, PyTorchReadsWhatAlloyWrites) {
  test::ScratchDir dir;
  Tensors in = sample_tensors();
  std::string path = dir.file("m.safetensors");
  std::string out = dir.file("out.json");
  safetensors_save(path, in.views, {{"format", "pt"}});
  std::string command = "/usr/bin/python3 " + std::string(ALLOY_TEST_DIR) + "/read_safetensors.py " + path + " " + out;
  int status = std::system(command.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) GTEST_SKIP() << "python3-torch not installed";
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command;
  auto result = nlohmann::json::parse(test::bytes_read(out));
  EXPECT_EQ(result.at("metadata").at("format"), "pt");
  ASSERT_EQ(result.at("tensors").size(), in.views.size());
  for (const auto& view : in.views) {
    const auto& tensor = result.at("tensors").at(view.name);
    EXPECT_EQ(tensor.at("shape").get<std::vector<std::int64_t>>(), view.shape);
    auto values = tensor.at("values").get<std::vector<double>>();
    ASSERT_EQ(static_cast<std::int64_t>(values.size()), tensor_ref_numel(view));
    for (std::size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(static_cast<float>(values[i]), view.data[i]) << view.name << "[" << i << "]";
    }
  }
}

TEST(Safetensors, WriterRejectsDuplicateAndReservedNames) {
  test::ScratchDir dir;
  float value = 1.0f;
  std::vector<TensorRef> twice = {{"a", {1}, &value}, {"a", {1}, &value}};
  EXPECT_EQ(error_of([&] { safetensors_save(dir.file("d.safetensors"), twice, {}); }).where().field, "a");
  std::vector<TensorRef> reserved = {{"__metadata__", {1}, &value}};
  error_of([&] { safetensors_save(dir.file("d.safetensors"), reserved, {}); });
  EXPECT_FALSE(std::filesystem::exists(dir.file("d.safetensors")));
}

TEST(Safetensors, ReadIntoChecksNamesAndShapes) {
  test::ScratchDir dir;
  Tensors in = sample_tensors();
  std::string path = dir.file("m.safetensors");
  safetensors_save(path, in.views, {});
  SafetensorsFile file = safetensors_open(path);

  Tensors fewer = sample_tensors();
  fewer.views.pop_back();
  Error extra = error_of([&] { safetensors_read_into(file, fewer.views); });
  EXPECT_EQ(extra.where().file, path);
  EXPECT_EQ(extra.where().field, "scale");
  EXPECT_ERROR_SAYS(extra, "unexpected tensor");

  Tensors more = sample_tensors();
  more.views.push_back({"lm_head.weight", {2}, more.storage.data()});
  Error missing = error_of([&] { safetensors_read_into(file, more.views); });
  EXPECT_EQ(missing.where().field, "lm_head.weight");
  EXPECT_ERROR_SAYS(missing, "missing");

  Tensors reshaped = sample_tensors();
  reshaped.views[0].shape = {4, 3};
  Error shape = error_of([&] { safetensors_read_into(file, reshaped.views); });
  EXPECT_EQ(shape.where().field, "wte.weight");
  EXPECT_ERROR_SAYS(shape, "[3, 4]");
  EXPECT_ERROR_SAYS(shape, "[4, 3]");
}

TEST(Safetensors, Bf16AndF16ReadAsFloats) {
  // Hugging Face weights are often stored in 16 bits: each element becomes the float it stands for.
  test::ScratchDir dir;
  const std::string path = dir.file("half.safetensors");
  const std::string header =
      R"({"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}, "b": {"dtype": "F16", "shape": [5], "data_offsets": [6, 16]}})";
  const std::uint16_t values[] = {0x3F80, 0xC020, 0x3E20,                  // bf16: 1, -2.5, 0.15625
                                  0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00};  // f16: 1, -2, 65504, 2^-24, inf
  std::uint64_t length = header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &length, 8);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(values), sizeof(values));
  test::bytes_write(path, bytes);
  const SafetensorsFile file = safetensors_open(path);
  std::vector<float> a(3), b(5);
  file.entry_copy(*file.entry_find("a"), a.data());
  file.entry_copy(*file.entry_find("b"), b.data());
  EXPECT_EQ(a, (std::vector<float>{1.0f, -2.5f, 0.15625f}));
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -2.0f);
  EXPECT_EQ(b[2], 65504.0f);
  EXPECT_EQ(b[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(b[4]));
}

struct BadFile {
  const char* label;
  std::string header;
  std::size_t data_bytes;
  const char* field;
  const char* says;
};

TEST(Safetensors, OpenRejectsEveryMalformedFile) {
  test::ScratchDir dir;
  std::string path = dir.file("bad.safetensors");
  const BadFile cases[] = {
      {"bad json", "{\"a\": {", 0, "header", "not valid JSON"},
      {"not an object", "[1, 2]", 0, "header", "JSON object"},
      {"i64", R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8, "\"a\".dtype", "I64"},
      {"no offsets", R"({"a": {"dtype": "F32", "shape": [1]}})", 4, "\"a\".data_offsets", "missing"},
      {"negative dim", R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4, "\"a\".shape",
       "non-negative"},
      {"out of range", R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4, "\"a\".data_offsets",
       "outside"},
      {"shape vs bytes", R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8, "\"a\".shape",
       "12 bytes"},
      {"overlap",
       R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, "\"b\".data_offsets", "overlaps"},
      {"gap",
       R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
       12, "\"b\".data_offsets", "gap"},
      {"trailing bytes", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 12, "data_offsets",
       "8 bytes after the last tensor"},
      {"metadata value", R"({"__metadata__": {"step": 3}})", 0, "__metadata__.step", "strings"},
  };
  for (const BadFile& c : cases) {
    raw_file_write(path, c.header, c.data_bytes);
    Error e = error_of([&] { safetensors_open(path); });
    EXPECT_EQ(e.where().file, path) << c.label;
    EXPECT_EQ(e.where().field, c.field) << c.label << ": " << e.format();
    EXPECT_TRUE(test::contains(e.message(), c.says)) << c.label << ": " << e.format();
  }
}

TEST(Safetensors, OpenRejectsShortFilesAndLengthsPastTheEnd) {
  test::ScratchDir dir;
  std::string path = dir.file("short.safetensors");
  test::bytes_write(path, "abc");
  Error tiny = error_of([&] { safetensors_open(path); });
  EXPECT_EQ(tiny.where().field, "header length");
  EXPECT_ERROR_SAYS(tiny, "3 bytes");

  std::string bytes(8, '\0');
  std::uint64_t length = 1000;
  std::memcpy(bytes.data(), &length, 8);
  test::bytes_write(path, bytes + "{}");
  Error past = error_of([&] { safetensors_open(path); });
  EXPECT_EQ(past.where().field, "header length");
  EXPECT_ERROR_SAYS(past, "header length 1000 runs past the end of the file (10 bytes)");

  Error missing = error_of([&] { safetensors_open(dir.file("none.safetensors")); });
  EXPECT_EQ(missing.where().file, dir.file("none.safetensors"));
  EXPECT_ERROR_SAYS(missing, "not found");
}

}  // namespace
}  // namespace alloy
