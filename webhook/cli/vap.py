"""``admit-guard vap``: the state-free policies as a ValidatingAdmissionPolicy."""

from __future__ import annotations

import click

from .options import InputError, config_option, load_config


@click.command()
@config_option
def vap(config_path) -> None:
    """Print the state-free policies as ValidatingAdmissionPolicy + binding (YAML).

    They hold inside the API server even while the guard is down. Exemptions, excluded
    namespaces and the namespace opt-out label are rendered too; exit 2 names an exemption
    that cannot be expressed.
    """
    from ..vap import VapError, render
    from .render import kubernetes_objects

    try:
        rendered = render(load_config(config_path))
    except VapError as err:
        raise InputError(f"cannot render the static policy: {err}") from None
    kubernetes_objects(rendered)
