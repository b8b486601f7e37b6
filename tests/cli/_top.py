"""A ferry publication written from Python, in the documented binary layout (struct ferry__publish,
src/engine/publish.h: 192 bytes, counters at 136), for the ferry top tests."""
import struct
import time

MAGIC = 0x3159524546


def publication(pid, name, path="-", counters=(0,) * 7):
    head = struct.pack("<QIIiIII", MAGIC, 1, 192, pid, 0, 0, 0) + struct.pack("<Q", time.time_ns())
    body = name.encode().ljust(64, b"\0") + path.encode().ljust(32, b"\0")
    return head + body + struct.pack("<7Q", *counters)
