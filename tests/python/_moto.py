"""moto's S3 server on 127.0.0.1 for the tests of s3:// (started and stopped by each test module;
the same way as test_s3.py starts it), and a clean AWS environment pointed at it."""
import http.client
import http.server
import socket
import subprocess
import sys
import threading
import time

import pytest

BUCKET = "ferry-test"

AWS_VARS = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
            "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT_URL_S3", "AWS_NO_SIGN_REQUEST", "AWS_SHARED_CREDENTIALS_FILE",
            "AWS_CONFIG_FILE", "FERRY_S3_ADDRESSING"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port, env=None):
    """moto's server on 127.0.0.1:port in a process of its own, once it accepts connections."""
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                pytest.fail("moto's server did not start on port %d" % port)
            time.sleep(0.1)


class Server:
    """moto's S3 server in a process of its own (no signature checks), one bucket made."""

    def __init__(self):
        import boto3
        self.port = free_port()
        self.endpoint = "http://127.0.0.1:%d" % self.port
        self.proc = start(self.port)
        self.key_id, self.secret = "testing", "testing"
        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                               aws_access_key_id="testing", aws_secret_access_key="testing")
        self.s3.create_bucket(Bucket=BUCKET)

    def url(self, key):
        return "s3://%s/%s" % (BUCKET, key)

    def put(self, key, data):
        self.s3.put_object(Bucket=BUCKET, Key=key, Body=data)
        return self.url(key)

    def get(self, key):
        return self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    def keys(self, prefix=""):
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return sorted(o["Key"] for p in pages for o in p.get("Contents", []))

    def uploads(self):
        return self.s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads") or []

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def use(monkeypatch, tmp_path, server, endpoint=None):
    """A clean AWS environment (empty HOME) with the server's endpoint and keys."""
    for v in AWS_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint or server.endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret)


HOP_HEADERS = ("transfer-encoding", "connection", "content-length", "date", "server")


class Proxy:
    """An HTTP server of the test's own on 127.0.0.1 in front of moto (upstream_port), one thread a
    connection: each request goes to self.handle(h, method, payload), h its BaseHTTPRequestHandler;
    forward() passes it on to moto."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _handle(self):
                n = int(self.headers.get("Content-Length") or 0)
                proxy.handle(self, self.command, self.rfile.read(n) if n else None)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def forward(self, h, method, payload):
        """h's request sent on to moto: its (status, headers, body)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=30)
        headers = {k: v for k, v in h.headers.items() if k.lower() != "connection"}
        conn.request(method, h.path, body=payload, headers=headers)
        resp = conn.getresponse()
        status, hdrs, body = resp.status, resp.getheaders(), resp.read()
        conn.close()
        return status, hdrs, body

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
