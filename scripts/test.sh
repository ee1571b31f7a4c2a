#!/usr/bin/env bash
# Run the project's checks: with no arguments the tests, lint and typecheck nox sessions.
# Other sessions: bash scripts/test.sh -s sanitize build   (nox --list shows them all)
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
exec nox "$@"
