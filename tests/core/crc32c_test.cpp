// CRC32C against the check value of the CRC catalogue and RFC 3720's
// vectors, and the hardware path against the portable table path.
#include "core/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace lathe {

TEST(Crc32c, CatalogueCheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c(s, std::strlen(s)), 0xE3069283u);
  EXPECT_EQ(crc32c_extend_portable(0, s, std::strlen(s)), 0xE3069283u);
}

TEST(Crc32c, Rfc3720Vectors) {
  std::vector<uint8_t> zeros(32, 0x00), ones(32, 0xFF), inc(32);
  for (int i = 0; i < 32; ++i) inc[size_t(i)] = uint8_t(i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46DD794Eu);
}

TEST(Crc32c, HardwareMatchesPortableAtEveryAlignmentAndSplit) {
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(4099);
  for (uint8_t& b : buf) b = uint8_t(rng());
  for (size_t start : {0, 1, 3, 7}) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 1000, 4090}) {
      const uint8_t* p = buf.data() + start;
      const uint32_t ref = crc32c_extend_portable(0, p, n);
      EXPECT_EQ(crc32c(p, n), ref) << start << " " << n;
      const size_t cut = n / 3;
      EXPECT_EQ(crc32c_extend(crc32c(p, cut), p + cut, n - cut), ref);
    }
  }
}

TEST(Crc32c, Hex) {
  EXPECT_EQ(crc32c_hex(0xE3069283u), "e3069283");
  EXPECT_EQ(crc32c_hex(0x0000000Fu), "0000000f");
}

}  // namespace lathe
