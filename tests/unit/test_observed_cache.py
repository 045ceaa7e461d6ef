"""The dataplane's cache of what the kernel holds shares the desired real servers once the
kernel holds exactly them (memory: a copy per virtual server was ~9 MiB at 10,000 Services),
and copies before it changes one. Over the host benchmark's stand-in backends, which record
every write as accepted; what the kernel does with the writes is proven in tests/kernel."""

from __future__ import annotations

import copy
from pathlib import Path

from bench import host, synthetic


def shared(h: host.Host) -> tuple[int, int]:
    obs, want = h.dp.observed, h.dp.desired.real_servers
    assert obs is not None
    assert obs.dests.keys() == want.keys()
    return sum(obs.dests[k] is want[k] for k in want), len(want)


def test_after_a_cold_sync_every_virtual_server_shares_the_desired_mapping(
    tmp_path: Path,
) -> None:
    h = host.new_host(tmp_path)
    work = host.cold_sync(h, synthetic.cluster(40, 3))
    assert work.writes > 0
    same, total = shared(h)
    assert total > 40 and same == total


def test_a_change_copies_then_shares_again_and_the_cache_stays_right(tmp_path: Path) -> None:
    h = host.new_host(tmp_path)
    cluster = synthetic.cluster(40, 3)
    host.cold_sync(h, cluster)
    key, svc, slices = cluster[0]
    fewer = copy.deepcopy(slices)
    gone = fewer[0]["endpoints"].pop()["addresses"][0]
    before = {k: dict(v) for k, v in h.dp.desired.real_servers.items()}
    work = host.one_change(h, key, svc, fewer)
    assert work.writes > 0
    same, total = shared(h)
    assert same == total
    obs = h.dp.observed
    assert obs is not None
    changed = [k for k in before if h.dp.desired.real_servers[k] != before[k]]
    assert changed
    for k in changed:
        assert all(d.address != gone for d in obs.dests[k])
        assert len(obs.dests[k]) == len(before[k]) - 1
    # And the next change, back again, adds the real server to each of them.
    work = host.one_change(h, key, svc, slices)
    assert work.writes == len(changed)
    assert shared(h) == (total, total)
