"""The periodic audit's gauges in a registry of their own, and what a scrape of them shows."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from webhook.serve.metrics import AuditGauges


class ScrapedGauges(AuditGauges):
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        super().__init__(self.registry)

    def scrape(self) -> str:
        return generate_latest(self.registry).decode()
