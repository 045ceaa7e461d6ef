"""A TCP, UDP and SCTP echo server for lab pods, all pods served by one process.

Each answer is one JSON line naming the pod that answered and the client address it saw, so a
test can tell which backend a Service picked and whether the source was masqueraded. One
process holds a listening socket in every pod's namespace: starting a Python interpreter per pod
costs seconds in the guest.

    python -m lab.net.echo --port 8080 NAME=NETNS [NAME=NETNS ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import selectors
import socket
import sys
from collections.abc import Sequence

from lab.net.netns import make_socket


def answer(
    name: str, proto: str, client: tuple[str, int], server: tuple[str, int], data: bytes
) -> bytes:
    body = {
        "pod": name,
        "proto": proto,
        "client": f"{client[0]}:{client[1]}",
        "server": f"{server[0]}:{server[1]}",
        "echo": data.decode("utf-8", "replace").strip(),
    }
    return json.dumps(body).encode() + b"\n"


def _listen(netns: str, port: int) -> tuple[socket.socket, socket.socket, socket.socket]:
    tcp = make_socket(netns, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("0.0.0.0", port))
    tcp.listen(128)
    tcp.setblocking(False)
    udp = make_socket(netns, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", port))
    udp.setblocking(False)
    sctp = make_socket(netns, socket.SOCK_STREAM, proto=socket.IPPROTO_SCTP)
    sctp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sctp.bind(("0.0.0.0", port))
    sctp.listen(128)
    sctp.setblocking(False)
    return tcp, udp, sctp


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
    client: tuple[str, int],
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
    try:
        data, client = sock.recvfrom(65536)
    except BlockingIOError:
        return
    # The reply leaves from the address the datagram was sent to only if we say so; the
    # wildcard socket reports its bound address, so report the port we listen on.
    sock.sendto(answer(name, "udp", client, sock.getsockname(), data), client)


def serve(targets: Sequence[tuple[str, str]], port: int) -> None:
    sel = selectors.DefaultSelector()
    for name, netns in targets:
        tcp, udp, sctp = _listen(netns, port)
        sel.register(tcp, selectors.EVENT_READ, (name, "tcp"))
        sel.register(udp, selectors.EVENT_READ, (name, "udp"))
        sel.register(sctp, selectors.EVENT_READ, (name, "sctp"))
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
