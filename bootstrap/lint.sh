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
# ansible-lint loads gpuboot's ansible.cfg, whose jsonfile fact cache would create .gpuboot/facts
# in the checkout it lints: lint writes nothing into the tree.
# ansible-lint also keeps a cache in the project's .ansible/ (ansible-compat): removed when lint
# made it.
facts=$(mktemp -d)
made_cache=$([ -e .ansible ] || echo yes)
trap 'rm -rf "$facts"; [ -z "$made_cache" ] || rm -rf .ansible' EXIT
ANSIBLE_CACHE_PLUGIN_CONNECTION=$facts .venv/bin/ansible-lint -q
echo "lint: clean"
