#!/usr/bin/env bash
# The quality gates CI runs before the tests: ruff on the Python, yamllint on every YAML
# file, ansible-lint (production profile, no rule skipped globally) on playbooks and roles.
# Configuration: pyproject.toml [tool.ruff], .yamllint, .ansible-lint.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "lint: ruff"
.venv/bin/ruff check --quiet bootstrap tests
echo "lint: yamllint"
.venv/bin/yamllint --strict .
echo "lint: ansible-lint"
# ansible-lint keeps a cache in the project's .ansible/ (ansible-compat): removed when lint made
# it, so lint writes nothing into the tree.
made_cache=$([ -e .ansible ] || echo yes)
trap '[ -z "$made_cache" ] || rm -rf .ansible' EXIT
.venv/bin/ansible-lint -q
echo "lint: clean"
