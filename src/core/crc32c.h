// CRC32C (Castagnoli, the checksum of iSCSI, ext4 and S3's x-amz-checksum-crc32c):
// checkpoint files carry one each so a torn or flipped byte is caught at load.
// The SSE4.2 crc32 instruction does the work where the CPU has it (checked
// once per process); elsewhere a byte-wise table gives the same values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lathe {

// Extends a running CRC (start from 0) over n bytes: crc32c_extend(crc32c_extend(0, a), b)
// equals the CRC of a followed by b.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// The portable path, exposed so tests can compare it with the hardware one.
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);
bool crc32c_has_hardware();

// 8 lowercase hex digits, as metadata.json stores it.
std::string crc32c_hex(uint32_t crc);

}  // namespace lathe
