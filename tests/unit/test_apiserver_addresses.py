"""The API server's addresses as the daemon reaches it: reserved, so no Service takes one."""

from __future__ import annotations

from ipvsproxy.daemon.apiserver import api_server_addresses


def test_the_api_servers_addresses_are_reserved_as_the_daemon_reaches_it() -> None:
    assert api_server_addresses("https://192.168.56.2:6443") == {"192.168.56.2"}
    assert api_server_addresses("https://[FD00::2]:6443") == {"fd00::2"}
    assert api_server_addresses("http://127.0.0.1") == {"127.0.0.1"}
    # A name: its addresses (resolved once, at start); one that does not resolve: none.
    assert "127.0.0.1" in api_server_addresses("https://localhost:6443")
    assert api_server_addresses("https://no-such-host.invalid:6443") == frozenset()
    assert api_server_addresses("") == frozenset()
