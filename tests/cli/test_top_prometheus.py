#!/usr/bin/env python3
"""ferry top --prometheus 127.0.0.1:0: scraped by urllib; the text parses as the Prometheus
exposition format (HELP and TYPE before samples, metric names, labels, float values); other
paths are 404; the server listens on loopback only."""
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

ferry = sys.argv[1]
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL: " + msg, file=sys.stderr)


p = subprocess.Popen([ferry, "top", "-i", "0.2", "--prometheus", "127.0.0.1:0"], stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
try:
    line = p.stderr.readline()
    m = re.search(r"serving http://(127\.0\.0\.1):(\d+)/metrics", line)
    if not m:
        fail("no 'serving' line: %r" % line)
        sys.exit(1)
    base = "http://%s:%s" % (m.group(1), m.group(2))
    time.sleep(0.5)
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    sample_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*"'
                           r'(,[a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*")*)\})? (-?[0-9.eE+-]+|NaN|\+Inf|-Inf)$')
    typed, helped, names = {}, set(), set()
    for l in text.rstrip("\n").split("\n"):
        if l.startswith("# HELP "):
            helped.add(l.split()[2])
        elif l.startswith("# TYPE "):
            _, _, name, kind = l.split(" ", 3)
            if kind not in ("counter", "gauge"):
                fail("bad TYPE %r" % l)
            typed[name] = kind
        else:
            mm = sample_re.match(l)
            if not mm:
                fail("not a sample line: %r" % l)
                continue
            name = mm.group(1)
            names.add(name)
            if name not in typed or name not in helped:
                fail("sample before its HELP/TYPE: %r" % l)
            if typed.get(name) == "counter" and not name.endswith("_total"):
                fail("counter without _total: %s" % name)
    for want in ("ferry_up", "ferry_cpu_busy_percent", "ferry_disk_read_bytes_per_second",
                 "ferry_disk_read_bytes_total", "ferry_disk_queue_depth"):
        if want not in names:
            fail("metric %s missing" % want)
    if not re.search(r'^ferry_disk_read_bytes_total\{device="[^"]+"\} [0-9.e+]+$', text, re.M):
        fail("no per-device label on ferry_disk_read_bytes_total")
    # Two scrapes in a row work (one connection each), and the CPU gauge is a percentage.
    text2 = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    busy = float(re.search(r"^ferry_cpu_busy_percent (\S+)$", text2, re.M).group(1))
    if not 0 <= busy <= 100:
        fail("cpu busy %r" % busy)
    try:
        urllib.request.urlopen(base + "/", timeout=5)
        fail("/ did not give 404")
    except urllib.error.HTTPError as e:
        if e.code != 404:
            fail("/ gave %d, not 404" % e.code)
finally:
    p.terminate()
    try:
        rc = p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
        fail("top did not stop on SIGTERM")
if rc != 0:
    fail("top exit status %d after SIGTERM" % rc)
u = subprocess.run([ferry, "top", "--prometheus", "example.com:80", "--count", "1"], stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE)
if u.returncode != 2:
    fail("a host name for ADDR: exit %d, expected 2 (numeric IPv4 only)" % u.returncode)
sys.exit(1 if failures else 0)
