#!/usr/bin/env bash
# Runs the browser tests (tests/browser): the web console and the
# data-analyst example in headless Chromium from the system's packages
# (apt-get install chromium; setup.sh does it), driven by Playwright for
# Python, against a real `pandastack serve` that the tests start. No browser
# is downloaded: Playwright launches /usr/bin/chromium (or $PANDASTACK_CHROMIUM).
#
# They run in the Python SDK's test venv (its [dev] extra has Playwright and
# uvicorn), through scripts/test-python.sh. Screenshots (of failures, and
# those in the README) go to $PANDASTACK_BROWSER_ARTIFACTS, default a temp
# dir the run prints and removes when it passes; with PANDASTACK_README_IMAGES=docs/img a run that
# passes refreshes the README's. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./scripts/test-python.sh tests/browser -p no:cacheprovider "$@"
