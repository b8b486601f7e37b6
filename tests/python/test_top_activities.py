"""ferry top --json shows the loader and checkpoint saves of a Python process (issue 21 item 7):
tests/cli/test_top_activities.py run against the package under test (this interpreter and its
sys.path) and the built CLI ($FERRY_CLI, default build/ferry)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_top_shows_loader_and_save():
    cli = os.environ.get("FERRY_CLI") or os.path.join(ROOT, "build", "ferry")
    if not os.access(cli, os.X_OK):
        pytest.skip("no ferry CLI at %s (build it, or set FERRY_CLI)" % cli)
    import ferry
    env = dict(os.environ, FERRY_PYTHON=sys.executable, FERRY_SOURCE_DIR=ROOT,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "cli", "test_top_activities.py"), cli], env=env,
                       capture_output=True, text=True, timeout=300)
    if p.returncode == 77:
        pytest.skip(p.stdout.strip().splitlines()[-1])
    assert p.returncode == 0, "%s\n%s" % (p.stdout, p.stderr)
    assert "package: %s" % ferry.__file__ in p.stdout, p.stdout
