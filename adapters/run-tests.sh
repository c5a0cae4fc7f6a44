#!/usr/bin/env bash
# Install the framework adapters (editable, with their test extras) into the active virtualenv
# and run their suites against the real frameworks, offline.
#
# Needs: an active virtualenv (or interpreter given as $PYTHON) where ctrlrun is installed, so that
# pip resolves the adapters' `ctrlrun>=0.1,<0.2` to this checkout instead of fetching it.
#
#   bash adapters/run-tests.sh --install-only   install and type-check the adapters, run nothing
#   bash adapters/run-tests.sh --installed      only the suites (installed before the core suite
#                                               ran, so it ran the adapter examples itself)
# Any other arguments go to each pytest run.
set -euo pipefail

step=all
case "${1:-}" in
    --install-only) step=install; shift ;;
    --installed) step=test; shift ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"

if ! "$python" -m pip show --quiet ctrlrun >/dev/null 2>&1; then
    echo "adapters/run-tests.sh: ctrlrun is not installed in this environment; run" >&2
    echo "  pip install -e ." >&2
    echo "from the repository root first." >&2
    exit 2
fi

adapters=(langgraph openai-agents pydantic-ai agent-framework dbos)
installs=() sources=() suites=()
for adapter in "${adapters[@]}"; do
    installs+=(-e "$here/$adapter[test]")
    sources+=("$here/$adapter/src")
    suites+=("$here/$adapter/tests")
done
if [ "$step" != test ]; then
    "$python" -m pip install --quiet --disable-pip-version-check "${installs[@]}"
    # Each adapter's package is typed like the core.
    "$python" -m mypy --strict "${sources[@]}"
fi
[ "$step" = install ] && exit 0

# The DBOS suite runs on SQLite and on this Postgres server (under CI a missing one fails it).
export CTRLRUN_TEST_POSTGRES_URL="${CTRLRUN_TEST_POSTGRES_URL:-}"
export OPENAI_API_KEY="" OPENAI_AGENTS_DISABLE_TRACING=1
cd "$here/.."
# One pytest run per adapter, so one suite's fixtures and helper modules never meet another's.
# The DBOS suite, most of it waiting on the processes its crash tests kill and restart, runs
# beside the others; its output is printed whole when it ends.
status=0
dbos_log="$(mktemp)"
"$python" -m pytest -q -p no:cacheprovider "$here/dbos/tests" "$@" >"$dbos_log" 2>&1 &
dbos_pid=$!
for suite in "${suites[@]}"; do
    [ "$suite" = "$here/dbos/tests" ] && continue
    "$python" -m pytest -q -p no:cacheprovider "$suite" "$@" || status=1
done
# The core suite skips running the adapter examples twice in a row when the adapters are not
# installed yet; they are now (with --installed they were already, and it ran them).
if [ "$step" = all ]; then
    "$python" -m pytest -q -p no:cacheprovider tests/test_examples.py -k runs_twice_in_a_row "$@" || status=1
fi
wait "$dbos_pid" || status=1
echo "--- adapters/dbos/tests"
cat "$dbos_log"
rm -f "$dbos_log"
exit "$status"
