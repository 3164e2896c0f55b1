"""``admit-guard certs``: a CA and a serving certificate for the webhook's Service."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from .options import InputError

if TYPE_CHECKING:
    from ..certs import Issued


@click.command()
@click.option("--service", default="admit-guard", show_default=True, help="The webhook Service's name.")
@click.option("--namespace", default="admit-guard", show_default=True, help="The Service's namespace.")
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("certs"), show_default=True
)
@click.option("--force", is_flag=True, help="Replace an existing CA (the webhooks' caBundle changes).")
@click.option("--renew", is_flag=True, help="New serving certificate from the existing CA (same ca.crt).")
def certs(service, namespace, out, force, renew) -> None:
    """Write a CA and a serving certificate (ca.crt, ca.key, tls.crt, tls.key) for the Service.

    Prints the base64 caBundle on stdout, for the webhook configurations. An existing CA is
    never replaced without --force; --renew rotates the serving certificate only.
    """
    from . import render

    if force and renew:
        raise click.UsageError("--force and --renew are exclusive: replace the CA, or keep it")
    try:
        if out.exists() and not out.is_dir():
            raise InputError(f"{out}: not a directory")
        if renew:
            issued, written = _renew(service, namespace, out), "tls.crt tls.key (ca.crt kept)"
        else:
            issued, written = _issue(service, namespace, out, force), "ca.crt ca.key tls.crt tls.key"
    except OSError as err:
        raise InputError(f"{out}: cannot write certificates here ({err.strerror or err})") from None
    render.certificates(out, written, issued)


def _renew(service: str, namespace: str, out: Path) -> Issued:
    """A new serving certificate from the CA in ``out``, which must be there."""
    from ..certs import CertificateError, renew

    try:
        return renew(service, namespace, out)
    except CertificateError as err:
        raise InputError(f"{err} (create a CA first: admit-guard certs --out {out})") from None


def _issue(service: str, namespace: str, out: Path, force: bool) -> Issued:
    """A new CA and serving certificate; a CA already in ``out`` is replaced only by force:
    the webhooks' caBundle trusts it."""
    from ..certs import issue

    existing = [name for name in ("ca.crt", "ca.key") if (out / name).exists()]
    if existing and not force:
        raise InputError(
            f"{out} holds a CA ({' '.join(existing)}): replacing it invalidates the webhooks' "
            "caBundle. Use --renew to rotate the serving certificate, or --force to replace the CA."
        )
    return issue(service, namespace, out)
