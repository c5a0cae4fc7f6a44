#!/usr/bin/env bash
# Install the framework adapters (editable, with their test extras) into the active virtualenv
# and run their suites against the real frameworks, offline.
#
# Needs: an active virtualenv (or interpreter given as $PYTHON) where ctrlrun is installed, so that
# pip resolves the adapters' `ctrlrun>=0.1,<0.2` to this checkout instead of fetching it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"

if ! "$python" -m pip show --quiet ctrlrun >/dev/null 2>&1; then
    echo "adapters/run-tests.sh: ctrlrun is not installed in this environment; run" >&2
    echo "  pip install -e ." >&2
    echo "from the repository root first." >&2
    exit 2
fi

"$python" -m pip install --quiet --disable-pip-version-check \
    -e "$here/langgraph[test]" -e "$here/openai-agents[test]"

export OPENAI_API_KEY="" OPENAI_AGENTS_DISABLE_TRACING=1
cd "$here/.."
exec "$python" -m pytest -q "$here/langgraph/tests" "$here/openai-agents/tests" "$@"
