"""``python -m lab demo`` (``make demo``): ipvsproxy at work on a 3-node lab cluster.

On the host it boots the lab kernel and runs itself inside; inside the guest it builds the
topology, starts the real control plane (etcd, kube-apiserver, kube-controller-manager),
registers the lab's Nodes and Pods as a kubelet would, and starts ``ipvsproxy run`` on every
node (``lab.cluster.kube.LabKube``), applies ``lab/demo/app.yaml``, sends traffic from pods,
nodes and the external client and prints who answered and which client address the pod saw,
then ``ipvsproxy status`` of node-1. Every expectation is checked; the exit status is 0 only if
all held. ``--inject-fault NAME`` starts the daemons with a broken dataplane (``lab/faults.py``):
the demo must then fail and say what did not behave.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

APP = Path(__file__).resolve().parent / "app.yaml"
STATUS_NODE = "node-1"
WAIT_SECONDS = 20.0
REQUEST_TIMEOUT = 1.5
REPEAT = 6  # requests per affinity / spread row


class StepFailed(Exception):
    pass


class Progress:
    """One line when a long step starts, one with its seconds when it ends."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        print(f"==> {what}", flush=True)
        t = time.monotonic()
        try:
            yield
        except BaseException as exc:
            print(f"    FAILED after {time.monotonic() - t:.1f} s: {_first_line(exc)}", flush=True)
            raise
        print(f"    ok ({time.monotonic() - t:.1f} s)", flush=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


# The traffic table -------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the traffic table: what was sent, what came back, whether it behaved."""

    source: str
    target: str
    service: str
    proto: str
    answered: str = ""
    client: str = ""
    ok: bool = False
    note: str = ""


@dataclass
class Probe:
    source: str  # as printed
    netns: str
    host: str
    port: int
    service: str
    proto: str
    check: Callable[[list[dict[str, Any] | str]], tuple[bool, str]]
    repeat: int = 1
    expect_answer: bool = True
    http: bool = False

    def run(self) -> Row:
        from lab.cluster import kube
        from lab.net import netns

        row = Row(self.source, f"{self.host}:{self.port}", self.service, self.proto)
        answers: list[dict[str, Any] | str] = []
        try:
            for _ in range(self.repeat):
                if self.http:
                    code, body = kube.http_get_from(
                        self.netns, f"http://{self.host}:{self.port}/", REQUEST_TIMEOUT
                    )
                    answers.append(f"{code} {body.strip()}")
                elif self.proto == "udp":
                    answers.append(
                        netns.udp_request(self.netns, self.host, self.port, timeout=REQUEST_TIMEOUT)
                    )
                else:
                    answers.append(
                        netns.tcp_request(self.netns, self.host, self.port, timeout=REQUEST_TIMEOUT)
                    )
        except OSError as exc:
            row.answered = "no answer"
            row.client = "-"
            why = exc.strerror or str(exc) or type(exc).__name__
            if self.expect_answer:
                row.note = f"FAIL: no answer ({why})"
            else:
                row.ok, row.note = True, "not forwarded, as expected"
            return row
        if not self.expect_answer:
            row.answered = _answered(answers)
            row.note = "FAIL: answered, but must not be forwarded"
            return row
        row.answered = _answered(answers)
        row.client = _clients(answers)
        row.ok, row.note = self.check(answers)
        if not row.ok:
            row.note = f"FAIL: {row.note}"
        return row


def _answered(answers: Sequence[dict[str, Any] | str]) -> str:
    if answers and isinstance(answers[0], str):
        return str(answers[0]).split()[0]
    pods = [str(a["pod"]) for a in answers if isinstance(a, dict)]
    if len(pods) == 1:
        return pods[0]
    counts: dict[str, int] = {}
    for p in pods:
        counts[p] = counts.get(p, 0) + 1
    if len(counts) == 1:
        return f"{pods[0]} ({len(pods)}/{len(pods)})"
    return " ".join(f"{p}:{n}" for p, n in sorted(counts.items()))


def _clients(answers: Sequence[dict[str, Any] | str]) -> str:
    if answers and isinstance(answers[0], str):
        return "-"
    ips = sorted({str(a["client"]).rsplit(":", 1)[0] for a in answers if isinstance(a, dict)})
    return ",".join(ips)


def _client_ip(answer: dict[str, Any] | str) -> str:
    return str(answer["client"]).rsplit(":", 1)[0] if isinstance(answer, dict) else ""


def _pods(answers: Sequence[dict[str, Any] | str]) -> set[str]:
    return {str(a["pod"]) for a in answers if isinstance(a, dict)}


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for line in (headers, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


# The application ---------------------------------------------------------------------------


def load_app(path: Path = APP) -> list[dict[str, Any]]:
    import yaml  # type: ignore[import-untyped]

    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@dataclass
class Deployed:
    """What the API server made of the application: Services as read back, pod placement."""

    services: dict[str, Any] = field(default_factory=dict)
    endpoints: dict[str, list[str]] = field(default_factory=dict)  # service -> pod names


def apply_services(core: Any, docs: Sequence[dict[str, Any]], namespace: str = "default") -> None:
    for doc in docs:
        if doc.get("kind") != "Service":
            continue
        body = {k: v for k, v in doc.items() if k != "status"}
        core.create_namespaced_service(namespace, body)
        if doc.get("status"):
            # What a cloud controller does once its load balancer exists.
            core.patch_namespaced_service_status(
                doc["metadata"]["name"], namespace, {"status": doc["status"]}
            )


def read_back(core: Any, disc: Any, docs: Sequence[dict[str, Any]]) -> Deployed:
    out = Deployed()
    for doc in docs:
        if doc.get("kind") != "Service":
            continue
        name = doc["metadata"]["name"]
        out.services[name] = core.read_namespaced_service(name, "default")
        slices = disc.list_namespaced_endpoint_slice(
            "default", label_selector=f"kubernetes.io/service-name={name}"
        ).items
        out.endpoints[name] = sorted(
            e.target_ref.name for s in slices for e in s.endpoints or [] if e.target_ref
        )
    return out


def _port(svc: Any, name: str) -> Any:
    for p in svc.spec.ports:
        if p.name == name:
            return p
    raise KeyError(name)


def services_table(dep: Deployed) -> None:
    rows = []
    for name, svc in dep.services.items():
        ingress = (svc.status.load_balancer.ingress or []) if svc.status.load_balancer else []
        extra = []
        if svc.spec.session_affinity == "ClientIP":
            extra.append("affinity ClientIP")
        if svc.spec.external_traffic_policy == "Local":
            extra.append(f"eTP Local, health :{svc.spec.health_check_node_port}")
        ports = ",".join(
            f"{p.port}{':' + str(p.node_port) if p.node_port else ''}/{p.protocol}"
            for p in svc.spec.ports
        )
        rows.append(
            [
                name,
                svc.spec.type,
                svc.spec.cluster_ip,
                ",".join(i.ip for i in ingress) or "-",
                ports,
                ",".join(dep.endpoints[name]) or "-",
                "; ".join(extra),
            ]
        )
    print()
    print_table(["SERVICE", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORTS", "ENDPOINTS", ""], rows)
    print()


def probes(topo: Any, dep: Deployed) -> list[Probe]:
    """The traffic the demo sends, each with what must come back."""
    ext = topo.external
    n1, n2, n3 = topo.nodes
    web, web_np, lb = dep.services["web"], dep.services["web-nodeport"], dep.services["web-lb"]
    sticky, local = dep.services["sticky"], dep.services["local"]
    web_pods = set(dep.endpoints["web"])
    local_pods = set(dep.endpoints["local"])
    client1, client3 = topo.pod("pod-1-2"), topo.pod("pod-3-2")

    def by(want: set[str], client: Callable[[dict[str, Any] | str], tuple[bool, str]]) -> Any:
        def check(answers: list[dict[str, Any] | str]) -> tuple[bool, str]:
            got = _pods(answers)
            if not got or not got <= want:
                return False, f"answered by {sorted(got)}, expected one of {sorted(want)}"
            for a in answers:
                ok, note = client(a)
                if not ok:
                    return False, note
            return True, client(answers[0])[1]

        return check

    def kept(ip: str) -> Callable[[dict[str, Any] | str], tuple[bool, str]]:
        def check(a: dict[str, Any] | str) -> tuple[bool, str]:
            seen = _client_ip(a)
            return (seen == ip, "pod address kept" if seen == ip else f"client {seen}, not {ip}")

        return check

    def any_client(a: dict[str, Any] | str) -> tuple[bool, str]:
        return True, "answered"

    def snat(a: dict[str, Any] | str) -> tuple[bool, str]:
        seen = _client_ip(a)
        if seen == ext.ip:
            return False, "external address reached the pod: not masqueraded"
        return True, "masqueraded (SNAT)"

    def preserved(a: dict[str, Any] | str) -> tuple[bool, str]:
        seen = _client_ip(a)
        if seen != ext.ip:
            return False, f"client {seen}: the external address {ext.ip} was not preserved"
        return True, "client address preserved"

    def sticks(answers: list[dict[str, Any] | str]) -> tuple[bool, str]:
        got = _pods(answers)
        if len(got) != 1 or not got <= web_pods:
            return False, f"affinity broken: answered by {sorted(got)}"
        return True, f"all {len(answers)} to one pod (affinity)"

    def spreads(answers: list[dict[str, Any] | str]) -> tuple[bool, str]:
        got = _pods(answers)
        if len(got) < 2 or not got <= web_pods:
            return False, f"answered by {sorted(got)}: not balanced over {sorted(web_pods)}"
        return True, f"balanced over {len(got)} pods"

    def health(code: int, local: int) -> Callable[[list[dict[str, Any] | str]], tuple[bool, str]]:
        def check(answers: list[dict[str, Any] | str]) -> tuple[bool, str]:
            text = str(answers[0])
            status, _, body = text.partition(" ")
            try:
                count = json.loads(body).get("localEndpoints")
            except ValueError:
                count = None
            if int(status) != code or count != local:
                return False, f"health check said {status} localEndpoints={count}"
            return True, f"health check: {status}, localEndpoints={count}"

        return check

    vip, np = web.spec.cluster_ip, _port(web_np, "http").node_port
    np_udp = _port(web_np, "dns").node_port
    lb_ip = lb.status.load_balancer.ingress[0].ip
    local_np = _port(local, "http").node_port
    local_lb = local.status.load_balancer.ingress[0].ip
    hc = local.spec.health_check_node_port
    pod1 = f"pod on {n1.name}"
    return [
        Probe(pod1, client1.netns, vip, 80, "web", "tcp", by(web_pods, kept(client1.ip))),
        Probe(
            f"pod on {n3.name}",
            client3.netns,
            vip,
            53,
            "web",
            "udp",
            by(web_pods, kept(client3.ip)),
        ),
        Probe(n2.name, n2.netns, vip, 80, "web", "tcp", by(web_pods, any_client)),
        *(
            Probe("external", ext.netns, n.ip, np, "web-nodeport", "tcp", by(web_pods, snat))
            for n in (n1, n2, n3)
        ),
        Probe("external", ext.netns, n3.ip, np_udp, "web-nodeport", "udp", by(web_pods, snat)),
        Probe("external", ext.netns, lb_ip, 80, "web-lb", "tcp", by(web_pods, snat)),
        Probe("external", ext.netns, n1.ip, np, "web-nodeport", "tcp", spreads, repeat=REPEAT),
        Probe(
            "external",
            ext.netns,
            n1.ip,
            _port(sticky, "http").node_port,
            "sticky",
            "tcp",
            sticks,
            repeat=REPEAT,
        ),
        Probe(pod1, client1.netns, sticky.spec.cluster_ip, 80, "sticky", "tcp", sticks, REPEAT),
        Probe("external", ext.netns, n2.ip, hc, "local", "http", health(200, 1), http=True),
        Probe("external", ext.netns, n1.ip, hc, "local", "http", health(503, 0), http=True),
        Probe("external", ext.netns, n2.ip, local_np, "local", "tcp", by(local_pods, preserved)),
        Probe("external", ext.netns, local_lb, 80, "local", "tcp", by(local_pods, preserved)),
        Probe(
            "external",
            ext.netns,
            n1.ip,
            local_np,
            "local",
            "tcp",
            by(local_pods, preserved),
            expect_answer=False,
        ),
    ]


def route_load_balancers(topo: Any, dep: Deployed) -> None:
    """The cloud's load balancers: each ingress address is routed from the external client to
    a node; for externalTrafficPolicy Local, to one whose health check says it has endpoints."""
    from lab.cluster import kube

    for svc in dep.services.values():
        ingress = (svc.status.load_balancer.ingress or []) if svc.status.load_balancer else []
        if not ingress:
            continue
        target = topo.nodes[0]
        if svc.spec.external_traffic_policy == "Local":
            hc = svc.spec.health_check_node_port
            healthy = [
                n
                for n in topo.nodes
                if _quiet_status(kube.http_get_from, topo.external.netns, f"http://{n.ip}:{hc}/")
                == 200
            ]
            target = healthy[0] if healthy else target
        for item in ingress:
            topo.exec(
                topo.external.netns, "ip", "route", "replace", f"{item.ip}/32", "via", target.ip
            )


def _quiet_status(get: Callable[..., tuple[int, str]], ns: str, url: str) -> int:
    try:
        return get(ns, url, REQUEST_TIMEOUT)[0]
    except OSError:
        return 0


def traffic_table(rows: Sequence[Row]) -> None:
    print()
    print_table(
        ["FROM", "TO", "SERVICE", "PROTO", "ANSWERED BY", "CLIENT SEEN", "CHECK"],
        [
            [
                r.source,
                r.target,
                r.service,
                r.proto,
                r.answered,
                r.client,
                ("ok: " if r.ok else "") + r.note,
            ]
            for r in rows
        ],
    )
    print()


# The run inside the guest ------------------------------------------------------------------


def run_in_guest(fault: str | None) -> int:
    from lab.cluster.kube import LabKube
    from lab.cluster.kubelet import LabPod
    from lab.net.topology import Cluster

    progress = Progress()
    failures: list[str] = []
    docs = load_app()
    with progress.step("Building the cluster: 3 node namespaces, 2 pods each, echo servers"):
        topo = Cluster.build(nodes=3, pods_per_node=2)
    lab: LabKube | None = None
    try:
        topo.start_pod_echo(port=8080)
        workdir = Path(tempfile.mkdtemp(prefix="ipvsproxy-demo-"))
        lab = LabKube(topo, workdir, fault=fault)
        with progress.step(
            f"Starting the real control plane (etcd, kube-apiserver, kube-controller-manager) "
            f"on {topo.apiserver_ip}:6443 and registering the Nodes"
        ):
            lab.start_apiserver()
            from kubernetes import client

            core: Any = client.CoreV1Api(lab.api)
            disc: Any = client.DiscoveryV1Api(lab.api)
        pods = []
        for doc in docs:
            if doc.get("kind") == "Pod":
                lab_pod = topo.pod(doc["metadata"]["name"])
                if doc["spec"].get("nodeName") != lab_pod.node:
                    raise StepFailed(f"{APP.name}: {lab_pod.name} is on {lab_pod.node}")
                pods.append(LabPod.from_manifest(doc, lab_pod.ip))
        with progress.step(
            f"Registering the {len(pods)} Pods of {APP.name} (the EndpointSlice controller "
            "writes the slices)"
        ):
            lab.start_controller(pods)
        with progress.step(f"Starting ipvsproxy run on {', '.join(n.name for n in topo.nodes)}"):
            lab.start_daemons()
            if fault:
                from lab.faults import FAULTS

                print(f"    FAULT INJECTED ({fault}): {FAULTS[fault]}", flush=True)
        with progress.step("Waiting for the first sync of ipvsproxy on every node (sync metric)"):
            started = time.monotonic()
            for node in topo.nodes:
                lab.wait_first_sync(node, timeout=120)
                print(f"    {node.name}: synced after {time.monotonic() - started:.1f} s")
        with progress.step(f"Applying the Services of {APP.name} (load-balancer status too)"):
            apply_services(core, docs)
            deadline = time.monotonic() + WAIT_SECONDS
            while True:
                dep = read_back(core, disc, docs)
                if all(dep.endpoints.values()) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        services_table(dep)
        rows: list[Row] = []
        attempts = 0
        try:
            with progress.step(
                f"Sending traffic until every check holds (up to {WAIT_SECONDS:.0f} s)"
            ):
                deadline = time.monotonic() + WAIT_SECONDS
                while True:
                    attempts += 1
                    route_load_balancers(topo, dep)  # the cloud's LB follows health checks
                    rows = [p.run() for p in probes(topo, dep)]
                    bad = [r for r in rows if not r.ok]
                    if not bad:
                        break
                    if time.monotonic() > deadline:
                        raise StepFailed(
                            f"{len(bad)} of {len(rows)} checks still failing after "
                            f"{attempts} rounds"
                        )
                    time.sleep(0.5)
        except StepFailed:
            pass
        traffic_table(rows)
        failures += [
            f"{r.source} -> {r.target} ({r.service}, {r.proto}): {r.note.removeprefix('FAIL: ')}"
            for r in rows
            if not r.ok
        ]
        state = lab.daemons.state_file(topo.node(STATUS_NODE)) if lab.daemons else Path()
        cmd = [sys.executable, "-m", "ipvsproxy", "status", "--state-file", str(state), "-n"]
        proc = None
        with (
            contextlib.suppress(StepFailed),
            progress.step(
                f"ip netns exec {STATUS_NODE} python -m ipvsproxy status --state-file {state} -n"
            ),
        ):
            proc = topo.exec(STATUS_NODE, *cmd, check=False)
            if proc.returncode != 0:
                said = (proc.stderr.strip() or proc.stdout.strip() or "-").splitlines()[-1]
                failures.append(
                    f"ipvsproxy status on {STATUS_NODE} exited with status "
                    f"{proc.returncode}: {said}"
                )
                raise StepFailed(f"exit status {proc.returncode}")
        if proc is not None:
            print()
            print(proc.stdout.rstrip())
            if proc.stderr.strip():
                print(proc.stderr.rstrip())
            print()
        exited = lab.daemons.exited() if lab.daemons else {}
        failures += [f"ipvsproxy on {n} exited with status {rc}" for n, rc in exited.items()]
    except (StepFailed, AssertionError, OSError) as exc:
        failures.append(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        if lab is not None and lab.daemons is not None:
            print(lab.daemons.logs(1500))
    finally:
        if lab is not None:
            lab.stop(cleanup=False)  # the guest goes away with everything in it
        topo.destroy()
    seconds = time.monotonic() - progress.start
    if failures:
        print(f"demo: FAILED ({len(failures)} problems, {seconds:.0f} s in the guest):")
        for f in failures:
            print(f"  - {f}")
        return 1
    print(f"demo: every check held ({len(rows)} traffic checks, {seconds:.0f} s in the guest)")
    return 0


# The host side -----------------------------------------------------------------------------


def run_on_host(fault: str | None, timeout: float) -> int:
    from lab.uml import guest

    start = time.monotonic()
    print("==> Booting the lab kernel (User-Mode Linux)", flush=True)
    booted = False

    def on_output(line: str) -> None:
        nonlocal booted
        if not booted:
            booted = True
            print(f"    ok ({time.monotonic() - start:.1f} s)", flush=True)
        print(line, flush=True)

    command = [sys.executable, "-m", "lab", "demo"]
    if fault:
        command += ["--inject-fault", fault]
    try:
        result = guest.boot(command, on_output=on_output, timeout=timeout)
    except guest.LabUnavailable as exc:
        print(f"lab demo: {exc}", file=sys.stderr)
        return 3
    if result.rc is None:
        print(f"lab demo: FAILED: {result.describe()}", file=sys.stderr)
        return 3
    print(f"demo finished in {time.monotonic() - start:.0f} s (exit status {result.rc})")
    return result.rc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from lab.faults import FAULTS

    parser.add_argument(
        "--inject-fault",
        choices=sorted(FAULTS),
        default=os.environ.get("LAB_DEMO_FAULT") or None,
        help="start ipvsproxy with a deliberately broken dataplane (the demo must fail): "
        + "; ".join(f"{k}: {v}" for k, v in FAULTS.items()),
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds the guest may take (default 600)"
    )


def main(args: argparse.Namespace) -> int:
    if os.environ.get("LAB_IN_GUEST") == "1":
        return run_in_guest(args.inject_fault)
    return run_on_host(args.inject_fault, args.timeout)
