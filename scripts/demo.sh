#!/usr/bin/env bash
# The README's first command: set up, build, and run ferry's storage-tuning suite on a generated
# temporary file (removed afterwards). Extra arguments go to `ferry bench --suite`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/ferry bench --suite --report ferry-suite.html "$@"
