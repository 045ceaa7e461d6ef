"""A TCP, UDP and SCTP echo server for lab pods, all pods served by one process.

Each answer is one JSON line naming the pod that answered and the client address it saw, so a
test can tell which backend a Service picked and whether the source was masqueraded. One
process holds listening sockets in every pod's namespace: starting a Python interpreter per pod
costs seconds in the guest. It answers on both families, on the same port: IPv4 sockets on
0.0.0.0 and IPv6-only sockets on ``::`` (so an IPv4 client is never seen as ``::ffff:a.b.c.d``).
Addresses in an answer read ``10.244.1.11:4242`` or ``[fd00:10:244:1::11]:4242``
(``lab.net.netns.split_hostport`` takes them apart).

    python -m lab.net.echo --port 8080 NAME=NETNS [NAME=NETNS ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import selectors
import socket
import struct
import sys
from collections.abc import Sequence
from typing import Any

from lab.net.netns import make_socket


def hostport(address: tuple[Any, ...]) -> str:
    """``a.b.c.d:port``, or ``[v6]:port`` for an IPv6 socket address."""
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def answer(
    name: str, proto: str, client: tuple[Any, ...], server: tuple[Any, ...], data: bytes
) -> bytes:
    body = {
        "pod": name,
        "proto": proto,
        "client": hostport(client),
        "server": hostport(server),
        "echo": data.decode("utf-8", "replace").strip(),
    }
    return json.dumps(body).encode() + b"\n"


def _socket(netns: str, family: int, kind: int, port: int, proto: int = 0) -> socket.socket:
    sock = make_socket(netns, kind, family, proto)
    if kind == socket.SOCK_STREAM:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        if kind == socket.SOCK_DGRAM:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
        sock.bind(("::", port))
    else:
        sock.bind(("0.0.0.0", port))
    if kind == socket.SOCK_STREAM:
        sock.listen(128)
    sock.setblocking(False)
    return sock


def _listen(netns: str, port: int) -> list[tuple[str, socket.socket]]:
    """(protocol, socket) listening on ``port`` in ``netns``: TCP, UDP and SCTP, each on IPv4
    and on IPv6."""
    socks = []
    for family in (socket.AF_INET, socket.AF_INET6):
        socks += [
            ("tcp", _socket(netns, family, socket.SOCK_STREAM, port)),
            ("udp", _socket(netns, family, socket.SOCK_DGRAM, port)),
            ("sctp", _socket(netns, family, socket.SOCK_STREAM, port, socket.IPPROTO_SCTP)),
        ]
    return socks


def _accept(listener: socket.socket, name: str, proto: str, sel: selectors.BaseSelector) -> None:
    try:
        conn, client = listener.accept()
    except BlockingIOError:
        return
    conn.setblocking(False)
    sel.register(conn, selectors.EVENT_READ, (name, "conn", client, proto))


def _serve_conn(
    conn: socket.socket,
    name: str,
    client: tuple[Any, ...],
    proto: str,
    sel: selectors.BaseSelector,
) -> None:
    """Answer every chunk a client sends until it closes: long-lived connections let tests
    watch an established flow survive dataplane changes."""
    try:
        data = conn.recv(65536)
        if data:
            conn.sendall(answer(name, proto, client, conn.getsockname(), data))
            return
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        pass  # a client that went away must not stop the server
    sel.unregister(conn)
    conn.close()


def _serve_udp(sock: socket.socket, name: str) -> None:
    if sock.family == socket.AF_INET6:
        _serve_udp6(sock, name)
        return
    try:
        data, client = sock.recvfrom(65536)
    except BlockingIOError:
        return
    # The reply leaves from the address the datagram was sent to only if we say so; the
    # wildcard socket reports its bound address, so report the port we listen on.
    sock.sendto(answer(name, "udp", client, sock.getsockname(), data), client)


PKTINFO6 = struct.Struct("=16sI")  # struct in6_pktinfo: address, interface index


def _serve_udp6(sock: socket.socket, name: str) -> None:
    """As for IPv4, but the reply leaves from the address the datagram was sent to
    (IPV6_PKTINFO): a node has an address on every interface, and a pod on the node asking the
    node's underlay address would otherwise be answered from cni0's, which its connected socket
    drops."""
    try:
        data, ancillary, _, client = sock.recvmsg(65536, socket.CMSG_SPACE(PKTINFO6.size))
    except BlockingIOError:
        return
    reply = answer(name, "udp", client, sock.getsockname(), data)
    for level, kind, info in ancillary:
        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_PKTINFO:
            local, _ = PKTINFO6.unpack(info[: PKTINFO6.size])
            pktinfo = PKTINFO6.pack(local, 0)  # from that address, out where routing says
            sock.sendmsg([reply], [(socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, pktinfo)], 0, client)
            return
    sock.sendto(reply, client)


def serve(targets: Sequence[tuple[str, str]], port: int) -> None:
    sel = selectors.DefaultSelector()
    for name, netns in targets:
        for proto, listener in _listen(netns, port):
            sel.register(listener, selectors.EVENT_READ, (name, proto))
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            name, kind = key.data[0], key.data[1]
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if kind in ("tcp", "sctp"):
                _accept(sock, name, kind, sel)
            elif kind == "conn":
                _serve_conn(sock, name, key.data[2], key.data[3], sel)
            else:
                _serve_udp(sock, name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.net.echo", description=__doc__)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("targets", nargs="+", metavar="NAME=NETNS")
    args = parser.parse_args(argv)
    targets = []
    for spec in args.targets:
        name, sep, netns = spec.partition("=")
        if not sep or not name or not netns:
            parser.error(f"bad target {spec!r}: expected NAME=NETNS")
        targets.append((name, netns))
    with contextlib.suppress(KeyboardInterrupt):
        serve(targets, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
