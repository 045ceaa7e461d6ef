"""What the dataplane reports about itself, for the daemon's metrics and /status."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ipvsproxy.core.identities import ServiceIdentity
from ipvsproxy.core.virtual_servers import DestKey, RealServerLike, ServiceKey, VirtualServer


@dataclass(frozen=True)
class Snapshot:
    """The dataplane's counters and sizes at one moment, taken under the daemon's sync lock.

    Telemetry reads this and nothing else of the dataplane: the backends, the state file and
    the desired state stay the dataplane's own. Every count is cumulative since the process
    started; the reader computes deltas."""

    operations: Mapping[tuple[str, str], int]  # (operation, "ok" | "error") -> count
    restore_failures: Mapping[int, int]  # family -> its iptables-restore runs that failed
    state_write_failures: int  # state file writes that failed (disk full, read-only)
    draining: int  # real servers at weight 0 waiting for their connections to end
    # (traffic policy, family) -> Services with endpoints but none on this node for it
    no_local_endpoints: Mapping[tuple[str, int], int]
    failed_services: int  # Services whose programming failed, waiting for their retry
    kernel_problems: int  # kernel reads and sysctls that fail


@dataclass(frozen=True)
class DesiredView:
    """The desired IPVS state and the names of the Services' virtual servers, for the daemon's
    /status. The mappings are the dataplane's own, not copies: read them under the daemon's
    sync lock, which every change of them holds."""

    virtual_servers: Mapping[ServiceKey, VirtualServer]
    real_servers: Mapping[ServiceKey, Mapping[DestKey, RealServerLike]]
    identities: Mapping[str, ServiceIdentity]  # service key -> the names of its virtual servers
    addresses: Collection[str] = ()  # what kube-ipvs0 should hold, both families
