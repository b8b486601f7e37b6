/*
 * PyTorch's files as `ferry ckpt inspect` and `verify` read them, without Python: the zip of a
 * torch.save file (records, their offsets, sizes and crc32s), the tensors its data.pkl names, and
 * a torch.distributed.checkpoint directory's `.metadata` (a pickle of DCP's Metadata), read by a
 * restricted unpickler that builds values and never calls anything: for `.metadata` it refuses
 * every global that is not one of the classes DCP writes. Functions return 0 or a negative code
 * with ferry_last_error() saying "file: offset N: field: why". Fuzzed by tests/fuzz/fuzz_torchfmt.c.
 */
#ifndef FERRY_TORCHFMT_H
#define FERRY_TORCHFMT_H

#include <stddef.h>
#include <stdint.h>

#define FERRY_TF_MAX_DIMS 32

/* Reads n bytes at off into buf; returns the bytes read (short only at the end) or -errno. */
typedef int64_t (*ferry_tf_read_fn)(void *user_data, uint64_t off, void *buf, size_t n);

struct ferry_tf_record {
	char *name;      /* as stored, with the archive's folder prefix */
	uint64_t header; /* offset of the local header, from the archive's start */
	uint64_t data;   /* offset of the data, from the archive's start */
	uint64_t size;   /* stored (= uncompressed) bytes */
	uint32_t crc;    /* as the central directory says */
	int method;      /* 0: stored; anything else is refused by torch.load */
};

struct ferry_tf_zip {
	struct ferry_tf_record *rec;
	size_t n;
	size_t prefix_len; /* "archive/" of "archive/data.pkl" */
};

/*
 * Parses the zip lying at [0, length) of what read returns (name is used in errors; base is
 * added to offsets in messages, for a zip inside a larger file). Every record's data must lie
 * inside the zip and be stored (method 0). Free with ferry_tf_zip_free.
 */
int ferry_tf_zip_parse(const char *name, uint64_t base, uint64_t length, ferry_tf_read_fn read, void *user_data,
		       struct ferry_tf_zip *out);
void ferry_tf_zip_free(struct ferry_tf_zip *z);
/* The record named prefix + name, or NULL. */
const struct ferry_tf_record *ferry_tf_zip_find(const struct ferry_tf_zip *z, const char *name);
/* Reads a record's data (at most max bytes) into a new buffer (*out, free()). */
int ferry_tf_zip_read(const char *name, const struct ferry_tf_zip *z, const struct ferry_tf_record *r,
		      ferry_tf_read_fn read, void *user_data, size_t max, uint8_t **out);
/*
 * Checks record r's crc32. Returns 1 (it matches), 0 (the archive stores 0 for a non-empty record:
 * written with crc32s off, not checked) or FERRY_EVERIFY naming file, offset and both values.
 */
int ferry_tf_zip_check(const char *name, uint64_t base, const struct ferry_tf_record *r, ferry_tf_read_fn read,
		       void *user_data);
/* The zip crc32 (IEEE 802.3) of buf, continued from crc (0 to start). */
uint32_t ferry_tf_crc32(uint32_t crc, const void *buf, size_t len);

/* A tensor that a torch.save data.pkl rebuilds. */
struct ferry_tf_tensor {
	char *name;     /* dotted path of dict keys and list indexes, "" for a bare tensor */
	char *key;      /* the storage record: data/<key> */
	char *location; /* "cpu", "cuda:0", ... */
	char dtype[24];
	int elsize;
	uint64_t storage_numel; /* of the whole storage, in elements */
	uint64_t offset;        /* storage offset, in elements */
	int ndim;
	uint64_t shape[FERRY_TF_MAX_DIMS];
	uint64_t stride[FERRY_TF_MAX_DIMS];
};

/* The tensors of a torch.save data.pkl (name: for errors). Free with ferry_tf_tensors_free. */
int ferry_tf_pt_tensors(const char *name, const uint8_t *pkl, size_t len, struct ferry_tf_tensor **out, size_t *n);
void ferry_tf_tensors_free(struct ferry_tf_tensor *t, size_t n);

/* A torch.save zip at [0, length) of what read returns: its records and the tensors data.pkl names. */
struct ferry_tf_pt {
	struct ferry_tf_zip zip;
	struct ferry_tf_tensor *t;
	size_t n;
};

/* Parses the zip and its data.pkl (base as for ferry_tf_zip_parse). Free with ferry_tf_pt_free. */
int ferry_tf_pt_open(const char *name, uint64_t base, uint64_t length, ferry_tf_read_fn read, void *user_data,
		     struct ferry_tf_pt *out);
void ferry_tf_pt_free(struct ferry_tf_pt *pt);
/*
 * Checks tensor i against its storage record: present, as large as the pickle says, and the
 * tensor's elements inside it. Returns 0 or FERRY_ECORRUPT naming the record.
 */
int ferry_tf_pt_check(const char *name, uint64_t base, const struct ferry_tf_pt *pt, size_t i);

/* One DCP item's bytes: a chunk of a tensor, or a bytes item (a torch.save zip either way). */
struct ferry_tf_dcp_piece {
	uint64_t offsets[FERRY_TF_MAX_DIMS], sizes[FERRY_TF_MAX_DIMS];
	char *file; /* relative_path; NULL when .metadata has no storage entry for it */
	uint64_t offset, length;
	int transformed; /* transform_descriptors (compression, ...): the bytes are not a plain zip */
};

struct ferry_tf_dcp_item {
	char *fqn;
	int is_bytes;
	char dtype[24];
	int elsize;
	int ndim;
	uint64_t size[FERRY_TF_MAX_DIMS];
	size_t n; /* pieces: the tensor's chunks, or 1 for a bytes item */
	struct ferry_tf_dcp_piece *piece;
};

struct ferry_tf_dcp {
	struct ferry_tf_dcp_item *item;
	size_t n;
	char version[32];
};

/* Parses a `.metadata` file's bytes (name: for errors). Free with ferry_tf_dcp_free. */
int ferry_tf_dcp_parse(const char *name, const uint8_t *buf, size_t len, struct ferry_tf_dcp *out);
void ferry_tf_dcp_free(struct ferry_tf_dcp *d);

#endif
