"""Ansible's own variables and templates, in this process: what a play's task would see on
a host (inventory, group_vars/ of the inventory and of playbooks/, role defaults and vars,
the run's extra variables, in Ansible's precedence) and what the `template` action would
write from it. `gpuboot render` uses it to show every file the phases write without one
Ansible process per host and without contacting a host."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# The template action's defaults (ansible.builtin.template): the rendered text must be
# byte for byte what a host receives.
TEMPLATE_OVERRIDES = {"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"}


@cache
def _ansible() -> SimpleNamespace:
    from ansible import constants, context
    from ansible._internal._templating._template_vars import generate_ansible_template_vars
    from ansible.module_utils.common.collections import ImmutableDict
    from ansible.playbook import Playbook
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar, trust_as_template
    from ansible.vars.hostvars import HostVars
    from ansible.vars.manager import VariableManager

    from gpuboot import content

    if not context.CLIARGS:
        context.CLIARGS = ImmutableDict(extra_vars=())
    # gpuboot's roles wherever it runs from: ansible.cfg's roles_path is read from the working
    # directory, and an operator works in the inventory's folder.
    roles = str(content.content_dir() / "roles")
    if roles not in constants.DEFAULT_ROLES_PATH:
        constants.DEFAULT_ROLES_PATH = [roles, *constants.DEFAULT_ROLES_PATH]
    # No host is contacted and no fact gathered here: a fact cache from an ansible.cfg in the
    # working directory (gpuboot's own sets a jsonfile one) would only create its folder there.
    constants.CACHE_PLUGIN = "ansible.builtin.memory"
    init_plugin_loader()
    return SimpleNamespace(Playbook=Playbook, Templar=Templar, trust_as_template=trust_as_template,
                           VariableManager=VariableManager, HostVars=HostVars, template_vars=generate_ansible_template_vars)


@dataclass
class HostView:
    """One host inside one play: its variables and a templar over them."""

    host: str
    variables: dict[str, Any]
    templar: Any

    def with_vars(self, **extra: Any) -> HostView:
        """The same host with more variables (a loop's item, a redacted secret)."""
        if not extra:
            return self
        variables = {**self.variables, **extra}
        return HostView(self.host, variables, self.templar.copy_with_new_env(available_variables=variables))

    def template(self, value: Any) -> Any:
        return self.templar.template(value)

    def holds(self, conditions: list) -> bool:
        return all(self.templar.evaluate_conditional(c) for c in conditions)

    def render_file(self, source: Path, dest: str) -> str:
        """What ansible.builtin.template would write to dest from source."""
        a = _ansible()
        variables = {**self.variables, **a.template_vars(path=source.name, fullpath=str(source), dest_path=dest)}
        searchpath = [str(source.parent), str(source.parent.parent)]
        templar = self.templar.copy_with_new_env(searchpath=searchpath, available_variables=variables)
        text = templar.template(a.trust_as_template(source.read_text()), escape_backslashes=False,
                                overrides=TEMPLATE_OVERRIDES)
        return text or ""


@dataclass
class PlayView:
    play: Any
    hosts: list[Any]

    def roles(self) -> list[tuple[str, Path, list]]:
        """(name, path, conditions) of each role the play lists under `roles:`."""
        return [(role.get_name(), Path(role._role_path), list(role.when or []))  # noqa: SLF001
                for role in self.play.get_roles()]


class PlaybookVariables:
    """Variables of a cluster's plays as Ansible computes them, without running Ansible."""

    def __init__(self, inventory_manager: Any, extra_vars: dict[str, Any]) -> None:
        a = _ansible()
        self._inventory = inventory_manager
        self._loader = inventory_manager._loader  # noqa: SLF001  (the DataLoader the inventory was read with)
        self._variables = a.VariableManager(loader=self._loader, inventory=inventory_manager)
        self._variables._extra_vars = extra_vars  # noqa: SLF001  (what `-e @file` would set)
        # Other hosts' variables (hostvars[...]), as the task queue manager provides them:
        # HostVars registers itself with the variable manager.
        a.HostVars(inventory=inventory_manager, variable_manager=self._variables, loader=self._loader)

    def plays(self, playbook: Path) -> Iterator[PlayView]:
        a = _ansible()
        book = a.Playbook.load(str(playbook), variable_manager=self._variables, loader=self._loader)
        # As ansible-playbook does: the playbook's directory is the base of its group_vars/.
        self._loader.set_basedir(str(playbook.parent))
        for play in book.get_plays():
            hosts = self._inventory.get_hosts(pattern=play.hosts, ignore_restrictions=True)
            yield PlayView(play, hosts)

    def host_view(self, play: PlayView, host: Any) -> HostView:
        a = _ansible()
        variables = self._variables.get_vars(play=play.play, host=host, include_hostvars=True)
        return HostView(host.name, variables, a.Templar(loader=self._loader, variables=variables))
