"""Which IP families a node serves: IPv6 where the kernel has it, it is not disabled and
ip6tables works (upstream's condition for its IPv6 proxier)."""

from __future__ import annotations

from pathlib import Path

from ipvsproxy.kernel.families import ipv6_unavailable


def test_ipv6_is_served_only_where_the_kernel_and_ip6tables_have_it(tmp_path: Path) -> None:
    if_inet6, disable = tmp_path / "if_inet6", tmp_path / "disable_ipv6"
    save = tmp_path / "ip6tables-save"
    save.write_text("#!/bin/sh\necho '*nat'\n")
    save.chmod(0o755)
    failing = tmp_path / "failing-save"
    failing.write_text("#!/bin/sh\necho 'table nat does not exist' >&2\nexit 3\n")
    failing.chmod(0o755)

    def why(cmd: Path = save) -> str | None:
        return ipv6_unavailable(str(cmd), if_inet6, disable)

    assert "the kernel has no IPv6" in str(why())
    if_inet6.write_text("")
    disable.write_text("1\n")
    assert why() == "IPv6 is disabled (net.ipv6.conf.all.disable_ipv6 = 1)"
    disable.write_text("0\n")
    assert why() is None
    assert why(failing) == f"{failing} -t nat failed: table nat does not exist"
    assert "cannot run" in str(why(tmp_path / "absent"))
