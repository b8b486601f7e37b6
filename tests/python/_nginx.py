"""nginx from Debian serving a directory on 127.0.0.1, for the throughput tests of s3:// and http://
(issue 23) and bench/remote-read.py: path-style s3://bucket/key under AWS_ENDPOINT_URL is the file
ROOT/bucket/key; nginx ignores the signature, answers HEAD and single ranges (206), gives an ETag
and honours If-Match (412). Started and stopped by its user: no daemon, no file outside its own
scratch directory. Found as `nginx` on PATH, /usr/sbin/nginx, FERRY_NGINX, or unpacked from the
Debian packages that scripts/stage-device.sh stages in .deb/nginx (the GPU machine has none).
"""
import os
import shutil
import socket
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find(scratch):
    """(argv prefix, environment) that runs nginx, or (None, why)."""
    exe = os.environ.get("FERRY_NGINX") or shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if exe:
        return [exe], None
    debs = os.path.join(REPO, ".deb", "nginx")
    if not os.path.isdir(debs) or not any(f.startswith("nginx_") for f in os.listdir(debs)):
        return None, "no nginx (apt-get install nginx; scripts/setup.sh installs it) and no .deb/nginx"
    root = os.path.join(scratch, "nginxroot")
    if not os.path.exists(os.path.join(root, "usr", "sbin", "nginx")):
        for f in sorted(os.listdir(debs)):
            if f.endswith(".deb"):
                subprocess.run(["dpkg", "-x", os.path.join(debs, f), root], check=True)
    env = dict(os.environ)
    libs = [os.path.join(root, d) for d in ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu")]
    env["LD_LIBRARY_PATH"] = ":".join(libs + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    return [os.path.join(root, "usr", "sbin", "nginx")], env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """nginx -p SCRATCH serving root on 127.0.0.1:port; .url is http://127.0.0.1:port.
    log=True writes each request to SCRATCH/access.log as
    '<connection serial> <method> <uri> <range> <status> <bytes sent>' (requests())."""

    def __init__(self, root, scratch, workers=1, log=False):
        os.makedirs(scratch, exist_ok=True)
        argv, env = find(scratch)
        if argv is None:
            raise FileNotFoundError(env)
        self.scratch = scratch
        self.access = os.path.join(scratch, "access.log")
        user = "user root root;" if os.geteuid() == 0 else ""  # workers must read root's 0700 dirs
        access = ("log_format f '$connection $request_method $uri $http_range $status $body_bytes_sent';\n"
                  "  access_log %s f;" % self.access) if log else "access_log off;"
        for attempt in range(5):
            self.port = _free_port()
            conf = os.path.join(scratch, "nginx.conf")
            with open(conf, "w") as f:
                f.write("""%s
worker_processes %d;
daemon off;
pid %s/nginx.pid;
error_log %s/error.log;
events { worker_connections 4096; }
http {
  default_type application/octet-stream;
  %s
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  keepalive_timeout 300s;
  client_body_temp_path %s/tmp; proxy_temp_path %s/tmp; fastcgi_temp_path %s/tmp;
  uwsgi_temp_path %s/tmp; scgi_temp_path %s/tmp;
  server { listen 127.0.0.1:%d; root %s; }
}
""" % (user, workers, scratch, scratch, access, *([scratch] * 5), self.port, os.path.abspath(root)))
            os.makedirs(os.path.join(scratch, "tmp"), exist_ok=True)
            self.proc = subprocess.Popen(argv + ["-p", scratch, "-c", conf, "-e", scratch + "/error.log"],
                                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    self.url = "http://127.0.0.1:%d" % self.port
                    return
                except OSError:
                    time.sleep(0.05)
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
            self.stop()
            if "Address already in use" not in err:
                raise RuntimeError("nginx did not start on port %d: %s" % (self.port, err[-500:]))
        raise RuntimeError("nginx: no free port after 5 tries")

    def requests(self):
        """The logged requests: (connection, method, uri, range, status, bytes) tuples."""
        out = []
        with open(self.access) as f:
            for line in f:
                c, m, u, r, s, b = line.split()
                out.append((int(c), m, u, r, int(s), int(b)))
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: the master stops its workers
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
