// CRC-32 (IEEE 802.3, as zlib computes it): table-driven, with carry-less multiplication on CPUs
// that have it, and two halves on two threads for large buffers.
#include <array>
#include <cstring>
#include <future>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "runtime/io/file_io.hpp"

namespace alloy {

namespace {

// Buffers of at least this many bytes are checksummed a half per thread.
constexpr std::size_t kParallelChecksumBytes = std::size_t{1} << 20;

using Crc32Tables = std::array<std::array<std::uint32_t, 256>, 8>;

// tables[k][b]: the CRC of byte b followed by k zero bytes (reflected polynomial 0xEDB88320).
Crc32Tables crc32_tables_build() {
  Crc32Tables tables{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0xEDB88320u : 0u);
    tables[0][b] = crc;
  }
  for (std::size_t k = 1; k < 8; ++k) {
    for (std::size_t b = 0; b < 256; ++b) {
      tables[k][b] = (tables[k - 1][b] >> 8) ^ tables[0][tables[k - 1][b] & 0xffu];
    }
  }
  return tables;
}

#if defined(__x86_64__)
// The CRC register `c` advanced over `n` bytes (n >= 64, a multiple of 16) by folding 128-bit
// lanes with carry-less multiplication, then reducing to 32 bits by Barrett reduction (Gopal et
// al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction", Intel, 2009).
// The constants are powers of x modulo the CRC-32 polynomial, bit-reflected: x^(4*128+32) and
// x^(4*128-32) fold 512 bits, x^(128+32) and x^(128-32) 128 bits, x^64 the last 64, and the
// Barrett pair is the polynomial and floor(x^64 / P).
// x's two halves multiplied by k's, added to the next 128 bits: x carried `k`'s distance ahead.
__attribute__((target("pclmul,sse4.1"))) __m128i fold(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

__attribute__((target("pclmul,sse4.1"))) std::uint32_t crc32_register_carryless(std::uint32_t c, const std::byte* p,
                                                                                 std::size_t n) {
  const __m128i fold512 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
  const __m128i fold128 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
  const __m128i fold64 = _mm_set_epi64x(0, 0x163cd6124);
  const __m128i barrett = _mm_set_epi64x(0x1f7011641, 0x1db710641);
  const __m128i low32 = _mm_set_epi32(0, 0, 0, -1);
  const auto load = [](const std::byte* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); };
  __m128i x0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(c)));
  __m128i x1 = load(p + 16), x2 = load(p + 32), x3 = load(p + 48);
  for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
    x0 = fold(x0, fold512, load(p));
    x1 = fold(x1, fold512, load(p + 16));
    x2 = fold(x2, fold512, load(p + 32));
    x3 = fold(x3, fold512, load(p + 48));
  }
  x0 = fold(fold(fold(x0, fold128, x1), fold128, x2), fold128, x3);
  for (; n >= 16; p += 16, n -= 16) x0 = fold(x0, fold128, load(p));
  __m128i x = _mm_xor_si128(_mm_clmulepi64_si128(x0, fold128, 0x10), _mm_srli_si128(x0, 8));     // 128 -> 64 bits
  x = _mm_xor_si128(_mm_srli_si128(x, 4), _mm_clmulepi64_si128(_mm_and_si128(x, low32), fold64, 0x00));  // -> 64 - 32
  __m128i q = _mm_clmulepi64_si128(_mm_and_si128(x, low32), barrett, 0x10);
  q = _mm_clmulepi64_si128(_mm_and_si128(q, low32), barrett, 0x00);
  return static_cast<std::uint32_t>(_mm_extract_epi32(_mm_xor_si128(x, q), 1));
}
#endif

}  // namespace

std::uint32_t crc32_update(std::uint32_t crc, std::span<const std::byte> bytes) {
  static const Crc32Tables t = crc32_tables_build();
  std::uint32_t c = ~crc;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
#if defined(__x86_64__)
  static const bool carryless = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  if (carryless && n >= 64) {
    const std::size_t bulk = n & ~std::size_t{15};
    c = crc32_register_carryless(c, p, bulk);
    p += bulk;
    n -= bulk;
  }
#endif
  for (; n >= 8; n -= 8, p += 8) {
    std::uint32_t lo = 0;
    std::uint32_t hi = 0;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^ t[3][hi & 0xffu] ^
        t[2][(hi >> 8) & 0xffu] ^ t[1][(hi >> 16) & 0xffu] ^ t[0][hi >> 24];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ t[0][(c ^ static_cast<std::uint32_t>(*p)) & 0xffu];
  return ~c;
}

namespace {

// Multiplies the 32-bit vector `vec` by the GF(2) matrix `mat` (32 columns).
std::uint32_t gf2_times(const std::array<std::uint32_t, 32>& mat, std::uint32_t vec) {
  std::uint32_t sum = 0;
  for (int i = 0; vec != 0; ++i, vec >>= 1)
    if (vec & 1u) sum ^= mat[static_cast<size_t>(i)];
  return sum;
}

std::array<std::uint32_t, 32> gf2_square(const std::array<std::uint32_t, 32>& mat) {
  std::array<std::uint32_t, 32> square{};
  for (size_t i = 0; i < 32; ++i) square[i] = gf2_times(mat, mat[i]);
  return square;
}

}  // namespace

std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t length_b) {
  if (length_b == 0) return crc_a;
  // `shift` advances a CRC register over one zero bit (the reflected polynomial's step); squaring
  // it doubles the bits, so crc_a moves over B's 8 * length_b zero bits by binary powers.
  std::array<std::uint32_t, 32> shift{};
  shift[0] = 0xedb88320u;
  for (size_t i = 1; i < 32; ++i) shift[i] = 1u << (i - 1);
  shift = gf2_square(gf2_square(gf2_square(shift)));  // one zero byte
  for (std::uint64_t bytes = length_b; bytes != 0; bytes >>= 1) {
    if (bytes & 1u) crc_a = gf2_times(shift, crc_a);
    if (bytes > 1) shift = gf2_square(shift);
  }
  return crc_a ^ crc_b;
}

std::uint32_t crc32_update_parallel(std::uint32_t crc, std::span<const std::byte> bytes) {
  if (bytes.size() < kParallelChecksumBytes) return crc32_update(crc, bytes);
  const std::size_t half = bytes.size() / 2;
  std::future<std::uint32_t> second =
      std::async(std::launch::async, [tail = bytes.subspan(half)] { return crc32_update(0, tail); });
  const std::uint32_t first = crc32_update(crc, bytes.first(half));
  return crc32_combine(first, second.get(), bytes.size() - half);
}

}  // namespace alloy
