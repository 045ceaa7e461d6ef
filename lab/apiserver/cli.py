"""``lab apiserver``: serve the lab API server in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from lab.apiserver.server import APIServer


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lab apiserver",
        description="Serve a Kubernetes API server (Services, EndpointSlices, Nodes, Events, "
        "Namespaces) for tests, and write a kubeconfig for it.",
    )
    parser.add_argument(
        "--listen",
        type=_listen,
        default=("127.0.0.1", 6443),
        metavar="HOST:PORT",
        help="address to listen on (default 127.0.0.1:6443; port 0 picks one)",
    )
    parser.add_argument(
        "--kubeconfig",
        required=True,
        metavar="FILE",
        help="kubeconfig file to write once listening",
    )
    parser.add_argument(
        "--bookmark-interval",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds between watch bookmarks (default 60)",
    )
    return parser  # fmt: skip


def cli_main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="lab apiserver: %(levelname)s %(message)s")
    host, port = args.listen
    done = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        done.set()

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server = APIServer(host=host, port=port, bookmark_interval=args.bookmark_interval)
        try:
            server.start()
        except OSError as exc:
            print(f"lab apiserver: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
            return 1
        try:
            server.write_kubeconfig(args.kubeconfig)
            print(f"lab apiserver listening on {server.url}", flush=True)
            while not done.wait(0.5):
                pass
        finally:
            server.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
