"""What every connection of one gateway process shares, and the policies they all apply.

The connection driver, placement and the app all take a :class:`GatewayServices`; keeping it
here, below all three, means none of them imports another for it.
"""

from __future__ import annotations

from gateway.batcher import InputBatcher
from gateway.leases import AttachmentLeases
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from store import AttachmentHolder, Scripts
from store.client import RedisClient
from store.keys import new_gateway_id
from store.pubsub import Subscriber

__all__ = ["GatewayServices"]

# The lease rounds renew reservations every fifth of an attachment lease (a second by default):
# this much slack, or a whole attachment lease if longer, survives a few missed rounds.
_TENANT_LEASE_SLACK_MS = 5_000


class GatewayServices:
    """What every connection of one gateway process shares."""

    def __init__(self, settings: GatewaySettings, client: RedisClient, scripts: Scripts,
                 subscriber: Subscriber, metrics: GatewayMetrics) -> None:
        self.settings = settings
        self.client = client
        self.scripts = scripts
        self.subscriber = subscriber
        self.metrics = metrics
        #: Redis outages, told once per change for the whole process: by its loops, and by
        #: the per-call failures of every connection (all of which fail at once in one).
        self.outages = subscriber.outages
        self.batcher = InputBatcher(scripts, max_entries=settings.input_log_max_entries,
                                    max_bytes=settings.input_log_max_bytes,
                                    outages=self.outages)
        #: This process as the holder of the sessions it attaches (a fresh id per process).
        self.holder = AttachmentHolder(gateway_id=new_gateway_id(),
                                       lease_ms=int(settings.attach_lease_s * 1000))
        self.leases = AttachmentLeases(
            scripts, self.holder, metrics.lease_renewals, outages=self.outages,
            tenant_lease_ms=self.tenant_lease_ms if settings.tenant_max_sessions else 0)
        self.draining = False

    @property
    def tenant_lease_ms(self) -> int:
        """How long a tenant reservation lasts unless renewed: past the disconnect grace, so a
        detached session stays counted until it could have expired (the reaper releases it
        as soon as the session ends)."""
        return (int(self.settings.disconnect_grace_s * 1000)
                + max(_TENANT_LEASE_SLACK_MS, self.holder.lease_ms))
