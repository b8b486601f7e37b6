/*
 * Little-endian loads and stores at any alignment, the byte order of every ferry file format
 * (shard indexes, Megatron indexes, safetensors' header length), whatever the host's.
 */
#ifndef FERRY_BASE_BYTEORDER_H
#define FERRY_BASE_BYTEORDER_H

#include <stdint.h>

static inline uint32_t ferry__rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t ferry__rd64(const uint8_t *p)
{
	return (uint64_t)ferry__rd32(p) | (uint64_t)ferry__rd32(p + 4) << 32;
}

static inline void ferry__wr32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++, v >>= 8)
		p[i] = (uint8_t)v;
}

static inline void ferry__wr64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++, v >>= 8)
		p[i] = (uint8_t)v;
}

#endif
