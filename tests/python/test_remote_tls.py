"""https:// reads check the server's certificate against the CA bundle: SSL_CERT_FILE (or
CURL_CA_BUNDLE) names it, as OpenSSL and curl take it, so a wheel's libcurl works where the
distribution keeps its certificates elsewhere than Debian; a server the bundle does not vouch for
is refused, never read."""
import http.server
import os
import shutil
import ssl
import subprocess
import sys
import textwrap
import threading

import pytest

import ferry


@pytest.fixture
def tls_server(tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("openssl (the command) is not installed: no certificate can be made")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    root = tmp_path / "www"
    root.mkdir()
    data = os.urandom(300_000)
    (root / "blob.bin").write_bytes(data)

    class Handler(http.server.BaseHTTPRequestHandler):
        """HEAD and ranged GET of the one object, as an object store answers them."""
        protocol_version = "HTTP/1.1"

        def _head(self, code, length, extra=()):
            self.send_response(code)
            self.send_header("Content-Length", str(length))
            self.send_header("ETag", '"v1"')
            self.send_header("Accept-Ranges", "bytes")
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()

        def do_HEAD(self):
            self._head(200, len(data))

        def do_GET(self):
            rng = self.headers.get("Range", "")
            if not rng.startswith("bytes="):
                self._head(200, len(data))
                self.wfile.write(data)
                return
            a, b = rng[6:].split("-")
            a, b = int(a), min(int(b), len(data) - 1)
            self._head(206, b - a + 1, [("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))])
            self.wfile.write(data[a:b + 1])

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield "https://127.0.0.1:%d/blob.bin" % httpd.server_address[1], data, cert
    httpd.shutdown()


# Each case in a fresh process: the bundle is read from the environment when requests are made.
CODE = textwrap.dedent("""
    import sys, ferry
    try:
        got = ferry.read(sys.argv[1])
    except Exception as e:
        print("ERROR", type(e).__name__, e)
        sys.exit(0)
    print("READ", len(got), bytes(got[:64]).hex())
""")


def _read(url, env):
    out = subprocess.run([sys.executable, "-c", CODE, url], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_https_checks_the_certificate(tls_server):
    why = ferry.backend_unavailable_reason("remote")
    if why:
        pytest.skip("the remote backend cannot run here: %s" % why)
    url, data, cert = tls_server
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "CURL_CA_BUNDLE")}
    got = _read(url, dict(env, SSL_CERT_FILE=str(cert)))
    assert got == "READ %d %s" % (len(data), data[:64].hex()), got
    got = _read(url, dict(env, CURL_CA_BUNDLE=str(cert)))
    assert got.startswith("READ %d" % len(data)), got
    # the system's bundle does not know this self-signed server: refused, naming the URL
    got = _read(url, env)
    assert got.startswith("ERROR") and "127.0.0.1" in got, got
