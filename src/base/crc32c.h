/* CRC-32C (Castagnoli), the checksum of shard records and index files (docs/DATA.md). */
#ifndef FERRY_BASE_CRC32C_H
#define FERRY_BASE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/*
 * The standard CRC-32C of len bytes, continuing from crc (0 to start): crc32c("123456789") is
 * 0xE3069283. SSE4.2's crc32 instruction where the CPU has it, else slicing-by-8.
 */
uint32_t ferry__crc32c(uint32_t crc, const void *buf, size_t len);

#endif
