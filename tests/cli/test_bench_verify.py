"""ferry bench --verify: passes on good data, fails naming the offset on a corrupt or misplaced block."""
import os
import struct

from _bench import check, engines, finish, run, scratch, stderr_line

BS = 64 << 10


def crc32c(data):
    """Bitwise reference crc32c (Castagnoli), independent of the C implementation."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def flip_byte(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))


def swap_blocks(path, a, b):
    with open(path, "r+b") as f:
        f.seek(a)
        da = f.read(BS)
        f.seek(b)
        db = f.read(BS)
        f.seek(a)
        f.write(db)
        f.seek(b)
        f.write(da)


def main():
    d = scratch()
    check(crc32c(b"123456789") == 0xE3069283, "reference crc32c check value")
    algos = ["crc32c", "xxh3"]
    for e in engines(d):
        for algo in algos:
            tag = f"{e}/{algo}"
            path = os.path.join(d, f"v-{e}-{algo}")
            rc, _, err = run("--filename", path, "--rw", "write", "--bs", "64k", "--size", "4m",
                             "--verify", algo, "--ioengine", e, "--iodepth", "4")
            if not check(rc == 0, f"{tag}: verified write exits 0", (rc, err), 0):
                continue
            for rw in ("read", "randread"):
                rc, out, err = run("--filename", path, "--rw", rw, "--bs", "64k", "--verify", algo,
                                   "--ioengine", e, "--iodepth", "4")
                check(rc == 0, f"{tag}: {rw} of good data verifies", (rc, err), 0)
                check("blocks verified" in out, f"{tag}: output counts verified blocks", out)

            if algo == "crc32c":
                # The documented block format, checked with an independent crc32c.
                with open(path, "rb") as f:
                    f.seek(5 * BS)
                    blk = bytearray(f.read(BS))
                magic, off, _seed, blen, alg, csum = struct.unpack_from("<8sQQIIQ", blk)
                check(magic == b"FERRYVB1", f"{tag}: header magic", magic, b"FERRYVB1")
                check(off == 5 * BS, f"{tag}: header carries the block's offset", off, 5 * BS)
                check((blen, alg) == (BS, 2), f"{tag}: header length and algorithm", (blen, alg), (BS, 2))
                blk[32:40] = b"\0" * 8
                check(crc32c(bytes(blk)) == csum, f"{tag}: header checksum is crc32c of the block",
                      hex(crc32c(bytes(blk))), hex(csum))

            # One corrupt byte in the middle of block 7.
            flip_byte(path, 7 * BS + 1234)
            rc, _, err = run("--filename", path, "--rw", "read", "--bs", "64k", "--verify", algo,
                             "--ioengine", e)
            check(rc == 1, f"{tag}: corrupt block exits 1", (rc, err), 1)
            check("checksum mismatch" in err and f"offset {7 * BS}" in err,
                  f"{tag}: message names the checksum and offset {7 * BS}", err.strip())
            check(len(stderr_line(err)) == 1, f"{tag}: one sentence", err)
            flip_byte(path, 7 * BS + 1234)

            # Blocks 2 and 9 swapped: checksums hold, offsets do not.
            swap_blocks(path, 2 * BS, 9 * BS)
            rc, _, err = run("--filename", path, "--rw", "read", "--bs", "64k", "--verify", algo,
                             "--ioengine", e)
            check(rc == 1, f"{tag}: misplaced block exits 1", (rc, err), 1)
            check("misplaced" in err and f"offset {2 * BS}" in err and f"offset {9 * BS}" in err,
                  f"{tag}: message names expected and found offsets", err.strip())
            swap_blocks(path, 2 * BS, 9 * BS)
            rc, _, err = run("--filename", path, "--rw", "randread", "--bs", "64k", "--verify", algo,
                             "--ioengine", e, "--runtime", "0.2")
            check(rc == 0, f"{tag}: restored file verifies again", (rc, err), 0)

    # Random writes visit every block once per pass (fio's random map): one pass of randwrite
    # over a zeroed file leaves no block unwritten, so a full verified read passes.
    zero = os.path.join(d, "zero")
    with open(zero, "wb") as f:
        f.write(bytes(4 << 20))
    rc, _, err = run("--filename", zero, "--rw", "randwrite", "--bs", "64k", "--io_size", "4m",
                     "--verify", "crc32c", "--randseed", "7")
    check(rc == 0, "one pass of verified random writes", (rc, err), 0)
    rc, _, err = run("--filename", zero, "--rw", "read", "--bs", "64k", "--verify", "crc32c")
    check(rc == 0, "a random pass wrote every block exactly once per pass", (rc, err), 0)

    # A file not written with --verify, and one read with another --bs.
    plain = os.path.join(d, "plain")
    with open(plain, "wb") as f:
        f.write(os.urandom(1 << 20))
    rc, _, err = run("--filename", plain, "--bs", "64k", "--verify", "crc32c")
    check(rc == 1 and "offset 0" in err and "verify" in err, "unverified data fails at offset 0", (rc, err))
    rc, _, err = run("--filename", os.path.join(d, "v-psync-crc32c"), "--bs", "32k", "--verify", "crc32c")
    if os.path.exists(os.path.join(d, "v-psync-crc32c")):
        check(rc == 1 and "--bs 65536" in err, "another --bs is named", (rc, err))
    rc, _, err = run("--filename", plain, "--bs", "16", "--verify", "crc32c")
    check(rc == 2 and "--bs" in err, "--verify with a block smaller than its header is a usage error", (rc, err))
    finish()


main()
