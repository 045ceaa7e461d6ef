#!/usr/bin/env python3
"""Writes and checks the kustomize overlays the Vagrant lab applies on its control plane.

Why a program and not a heredoc in the shell scripts: what has to change lives *inside* other
documents (clusterCIDR inside the KubeProxyConfiguration text of a ConfigMap key, the flannel
backend inside a JSON string), and kustomize silently does nothing when a patch names a
resource that is not there (a ConfigMap made by a configMapGenerator is rendered with a hash
suffix, for instance). So this program finds the resources in the rendered base, writes the
overlay, renders the overlay again and refuses (exit status 1, with the reason) unless the
result really carries the wanted values. Nothing in ``deploy/`` or in flannel's manifest is
edited: the overlay is a separate directory the scripts pass to ``kubectl apply -k``.

It runs on the guests with Debian's python3 and python3-yaml, and on the development machine
in tests/harness/test_vagrant.py, which feeds it sample bases and the real ``deploy/``.

    overlay.py ipvsproxy --base DIR --out DIR --cluster-cidr CIDR --api-server HOST:PORT
               [--image REF] [--privileged] [--kubectl PATH]
    overlay.py flannel --manifest FILE --out DIR --pod-cidr CIDR --api-server HOST:PORT
               --iface-regex REGEX [--kubectl PATH]
    overlay.py pod-subnet < ClusterConfiguration.yaml
    overlay.py target --base DIR [--image REF] [--kubectl PATH]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

Doc = dict[str, Any]

# kustomize's name suffix for generated ConfigMaps and Secrets: '-' and ten characters.
HASH_SUFFIX = re.compile(r"^(?P<name>.+)-[a-z0-9]{10}$")


class OverlayError(Exception):
    """What the scripts must stop on: printed as one line, exit status 1."""


@dataclass
class Overlay:
    """A kustomization: resources plus strategic-merge patches selected by kind and name."""

    resources: list[str]
    patches: list[tuple[str, str, Doc]] = field(default_factory=list)

    def patch(self, kind: str, name: str, body: Doc) -> None:
        """Add a patch; one for the same object is merged into it (one patch per object keeps
        the written overlay readable)."""
        for k, n, existing in self.patches:
            if (k, n) == (kind, name):
                merge(existing, body)
                return
        self.patches.append((kind, name, body))

    def render(self) -> str:
        doc: Doc = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": self.resources,
            "patches": [
                {
                    "target": {"kind": kind, "name": f"^{re.escape(name)}$"},
                    "patch": dump(body),
                }
                for kind, name, body in self.patches
            ],
        }
        header = "# Written by vagrant/provision/overlay.py; rewritten on every provision.\n"
        return header + dump(doc)


def merge(into: Doc, extra: Doc) -> None:
    """Deep-merge two patches as the API server would merge them: mappings key by key, lists
    of named items (containers, env) item by item, anything else replaced by ``extra``."""
    for key, value in extra.items():
        old = into.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            merge(old, value)
        elif (
            isinstance(value, list)
            and isinstance(old, list)
            and all(isinstance(item, dict) and "name" in item for item in old + value)
        ):
            by_name = {item["name"]: item for item in old}
            for item in value:
                if item["name"] in by_name:
                    merge(by_name[item["name"]], item)
                else:
                    old.append(item)
        else:
            into[key] = value


class _Dumper(yaml.SafeDumper):  # type: ignore[misc]
    """Multi-line strings as literal blocks, so a patched config file reads as written."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(doc: Doc) -> str:
    return str(yaml.dump(doc, Dumper=_Dumper, sort_keys=False))


def load_docs(text: str) -> list[Doc]:
    """The objects of a multi-document YAML stream, empty documents dropped."""
    docs = [d for d in yaml.safe_load_all(text) if d]
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d:
            raise OverlayError(f"not a Kubernetes object: {str(d)[:80]}")
    return docs


def kustomize(kubectl: str, directory: Path) -> list[Doc]:
    """`kubectl kustomize DIR`, parsed: what `kubectl apply -k DIR` would send."""
    proc = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise OverlayError(f"kubectl kustomize {directory} failed: {proc.stderr.strip()}")
    return load_docs(proc.stdout)


def name_of(doc: Doc) -> str:
    return str(doc.get("metadata", {}).get("name", ""))


def of_kind(docs: Sequence[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d.get("kind") == kind]


def normalize_image(ref: str) -> str:
    """docker.io/library/ipvsproxy:dev for ipvsproxy:dev, as the container runtime reads it."""
    first, _, rest = ref.partition("/")
    if not rest:
        return f"docker.io/library/{ref}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{ref}"
    return ref


def patch_names(docs: Sequence[Doc], doc: Doc) -> list[str]:
    """The names a patch must target to reach ``doc``: its rendered name and, for a generated
    ConfigMap, the name without the hash suffix (which is what kustomize matches patches
    against). Patching both is safe: a patch whose target matches nothing is a no-op, and the
    stripped name is only used when no other object of the kind already has it."""
    name = name_of(doc)
    names = [name]
    m = HASH_SUFFIX.match(name)
    if m and not any(name_of(d) == m["name"] for d in of_kind(docs, doc["kind"])):
        names.append(m["name"])
    return names


def kube_proxy_configs(docs: Sequence[Doc]) -> list[tuple[Doc, str, Doc]]:
    """(ConfigMap, key, parsed KubeProxyConfiguration) for every key that holds one."""
    found = []
    for cm in of_kind(docs, "ConfigMap"):
        for key, text in (cm.get("data") or {}).items():
            if "KubeProxyConfiguration" not in str(text):
                continue
            try:
                parsed = yaml.safe_load(str(text))
            except yaml.YAMLError:
                continue
            if isinstance(parsed, dict) and parsed.get("kind") == "KubeProxyConfiguration":
                found.append((cm, str(key), parsed))
    return found


def containers(ds: Doc) -> list[Doc]:
    spec = ds.get("spec", {}).get("template", {}).get("spec", {})
    result: list[Doc] = spec.get("containers") or []
    return result


def env_value(docs: Sequence[Doc], container: Doc, name: str) -> str | None:
    """The value ``name`` gets in ``container``: a literal or a ConfigMap key it refers to."""
    for env in container.get("env") or []:
        if env.get("name") != name:
            continue
        if "value" in env:
            return str(env["value"])
        ref = (env.get("valueFrom") or {}).get("configMapKeyRef")
        if ref:
            for cm in of_kind(docs, "ConfigMap"):
                if name_of(cm) == ref.get("name"):
                    value = (cm.get("data") or {}).get(ref.get("key"))
                    return None if value is None else str(value)
        return None
    return None


def set_env(
    overlay: Overlay,
    docs: Sequence[Doc],
    ds: Doc,
    container: Doc,
    values: dict[str, str],
) -> None:
    """Give ``container`` these environment variables. A variable the base already takes from
    a ConfigMap key is set by patching that key (adding a literal `value` next to its
    `valueFrom` would make the DaemonSet invalid); any other is set or added as a literal."""
    literal: list[Doc] = []
    for name, value in values.items():
        existing = next((e for e in container.get("env") or [] if e.get("name") == name), None)
        value_from = (existing or {}).get("valueFrom")
        if value_from is None:
            literal.append({"name": name, "value": value})
            continue
        ref = value_from.get("configMapKeyRef")
        if not ref:
            raise OverlayError(
                f"{name} in {name_of(ds)}/{container.get('name')} comes from {value_from},"
                " which this overlay does not know how to set"
            )
        targets = [cm for cm in of_kind(docs, "ConfigMap") if name_of(cm) == ref.get("name")]
        if not targets:
            raise OverlayError(f"{name} refers to ConfigMap {ref.get('name')}, not in the base")
        for patch_name in patch_names(docs, targets[0]):
            overlay.patch(
                "ConfigMap",
                patch_name,
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": patch_name},
                    "data": {str(ref["key"]): value},
                },
            )
    if literal:
        overlay.patch(
            "DaemonSet",
            name_of(ds),
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": name_of(ds)},
                "spec": {
                    "template": {
                        "spec": {"containers": [{"name": container["name"], "env": literal}]}
                    }
                },
            },
        )


def split_api_server(api_server: str) -> tuple[str, str]:
    host, sep, port = api_server.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise OverlayError(f"--api-server must be HOST:PORT, not {api_server!r}")
    return host, port


def check_cidr(cidr: str) -> str:
    try:
        return str(ipaddress.IPv4Network(cidr))
    except ValueError as exc:
        raise OverlayError(f"not an IPv4 CIDR: {cidr!r} ({exc})") from None


def relative(target: Path, start: Path) -> str:
    """kustomize wants bases as paths relative to the kustomization."""
    return os.path.relpath(target.resolve(), start.resolve())


def write(out: Path, overlay: Overlay) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "kustomization.yaml").write_text(overlay.render())


# --- ipvsproxy ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProxyTarget:
    """Where ipvsproxy lives in the rendered base; the scripts wait on this DaemonSet."""

    namespace: str
    daemonset: str
    container: str

    def env_file(self) -> str:
        return (
            f"IPVSPROXY_NAMESPACE={self.namespace}\n"
            f"IPVSPROXY_DAEMONSET={self.daemonset}\n"
            f"IPVSPROXY_CONTAINER={self.container}\n"
        )


def proxy_target(docs: Sequence[Doc], image: str) -> ProxyTarget:
    """Where ``image`` runs in the rendered base: what the workers read from deploy/ itself
    (the names the control plane deploys under) instead of from the control plane."""
    ds, container = find_proxy(docs, image)
    namespace = str(ds.get("metadata", {}).get("namespace") or "default")
    return ProxyTarget(namespace, name_of(ds), str(container["name"]))


def find_proxy(docs: Sequence[Doc], image: str) -> tuple[Doc, Doc]:
    """The one DaemonSet container running ``image`` (the image the lab builds and imports)."""
    wanted = normalize_image(image)
    hits = [
        (ds, c)
        for ds in of_kind(docs, "DaemonSet")
        for c in containers(ds)
        if normalize_image(str(c.get("image", ""))) == wanted
    ]
    if len(hits) != 1:
        images = sorted(
            str(c.get("image")) for d in of_kind(docs, "DaemonSet") for c in containers(d)
        )
        raise OverlayError(
            f"expected exactly one DaemonSet container with image {image}, found {len(hits)}"
            f" (DaemonSet images in the base: {images})"
        )
    return hits[0]


def with_cluster_cidr(text: str, cidr: str) -> str:
    """The configuration text with its top-level clusterCIDR replaced (or added), line by
    line, so the comments that explain the other fields survive."""
    line = re.compile(r"^clusterCIDR:.*$", re.MULTILINE)
    if line.search(text):
        text = line.sub(f"clusterCIDR: {cidr}", text, count=1)
    else:
        text = text.rstrip("\n") + f"\nclusterCIDR: {cidr}\n"
    parsed = yaml.safe_load(text)
    if not isinstance(parsed, dict) or parsed.get("clusterCIDR") != cidr:
        raise OverlayError("could not set clusterCIDR in the KubeProxyConfiguration text")
    return text


def ipvsproxy_overlay(
    base_docs: Sequence[Doc],
    base: Path,
    out: Path,
    cidr: str,
    api_server: str,
    image: str,
    privileged: bool = False,
) -> tuple[Overlay, ProxyTarget]:
    """The overlay setting the KubeProxyConfiguration's clusterCIDR and the API server address
    ipvsproxy uses before any Service works (KUBERNETES_SERVICE_HOST/PORT). With
    ``privileged``, the container's securityContext becomes just `privileged: true`, for hosts
    whose security module forbids the sysctl writes of the unprivileged container
    (deploy/README.md, "Privileges")."""
    configs = kube_proxy_configs(base_docs)
    if len(configs) != 1:
        raise OverlayError(
            f"expected exactly one KubeProxyConfiguration in a ConfigMap of {base},"
            f" found {len(configs)}"
        )
    cm, key, cfg = configs[0]
    if (cfg.get("clientConnection") or {}).get("kubeconfig"):
        print(
            "overlay.py: warning: the KubeProxyConfiguration names a kubeconfig; the API server"
            " address set here only reaches an in-cluster client",
            file=sys.stderr,
        )
    overlay = Overlay(resources=[relative(base, out)])
    text = with_cluster_cidr(str(cm["data"][key]), cidr)
    for patch_name in patch_names(base_docs, cm):
        overlay.patch(
            "ConfigMap",
            patch_name,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": patch_name},
                "data": {key: text},
            },
        )
    ds, container = find_proxy(base_docs, image)
    host, port = split_api_server(api_server)
    set_env(
        overlay,
        base_docs,
        ds,
        container,
        {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port},
    )
    if privileged:
        # Replaced, not merged: privileged next to allowPrivilegeEscalation: false is invalid.
        overlay.patch(
            "DaemonSet",
            name_of(ds),
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": name_of(ds)},
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": container["name"],
                                    "securityContext": {"$patch": "replace", "privileged": True},
                                }
                            ]
                        }
                    }
                },
            },
        )
    return overlay, proxy_target(base_docs, image)


def verify_ipvsproxy(
    docs: Sequence[Doc], cidr: str, api_server: str, image: str, privileged: bool = False
) -> None:
    """Refuse an overlay whose rendering does not carry what was asked for."""
    configs = kube_proxy_configs(docs)
    cidrs = [str(cfg.get("clusterCIDR")) for _, _, cfg in configs]
    if cidrs != [cidr]:
        raise OverlayError(f"rendered overlay has clusterCIDR {cidrs}, wanted [{cidr}]")
    _, container = find_proxy(docs, image)
    host, port = split_api_server(api_server)
    for name, want in (("KUBERNETES_SERVICE_HOST", host), ("KUBERNETES_SERVICE_PORT", port)):
        got = env_value(docs, container, name)
        if got != want:
            raise OverlayError(f"rendered overlay gives {name}={got!r}, wanted {want!r}")
    if privileged and container.get("securityContext") != {"privileged": True}:
        raise OverlayError(f"rendered securityContext is {container.get('securityContext')}")


# --- flannel --------------------------------------------------------------------------------


def flannel_overlay(
    docs: Sequence[Doc], manifest_name: str, cidr: str, api_server: str, iface_regex: str
) -> Overlay:
    """flannel with the host-gw backend on the lab's pod CIDR, talking to the API server at
    its real address (the `kubernetes` Service's cluster IP only works once ipvsproxy runs,
    and ipvsproxy's pods need no pod network, but every other pod needs flannel first), on the
    interface holding the private-network address (the first NIC is the provider's NAT, with
    the same address on every VirtualBox machine)."""
    net_confs = [
        cm for cm in of_kind(docs, "ConfigMap") if "net-conf.json" in (cm.get("data") or {})
    ]
    if len(net_confs) != 1:
        raise OverlayError(f"expected one ConfigMap with net-conf.json, found {len(net_confs)}")
    cm = net_confs[0]
    net_conf = json.loads(cm["data"]["net-conf.json"])
    net_conf["Network"] = cidr
    net_conf["Backend"] = {"Type": "host-gw"}
    overlay = Overlay(resources=[manifest_name])
    overlay.patch(
        "ConfigMap",
        name_of(cm),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name_of(cm)},
            "data": {"net-conf.json": json.dumps(net_conf, indent=2) + "\n"},
        },
    )
    ds, container = find_flanneld(docs)
    host, port = split_api_server(api_server)
    set_env(
        overlay,
        docs,
        ds,
        container,
        {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            # flanneld reads every flag from FLANNELD_<FLAG>; --iface-regex matches addresses.
            "FLANNELD_IFACE_REGEX": iface_regex,
        },
    )
    return overlay


def find_flanneld(docs: Sequence[Doc]) -> tuple[Doc, Doc]:
    hits = [
        (ds, c)
        for ds in of_kind(docs, "DaemonSet")
        for c in containers(ds)
        if any("flanneld" in str(part) for part in (c.get("command") or []) + [c.get("image", "")])
        and c.get("name") == "kube-flannel"
    ]
    if len(hits) != 1:
        raise OverlayError(f"expected one kube-flannel container in a DaemonSet, found {len(hits)}")
    return hits[0]


def verify_flannel(docs: Sequence[Doc], cidr: str, api_server: str, iface_regex: str) -> None:
    cms = [cm for cm in of_kind(docs, "ConfigMap") if "net-conf.json" in (cm.get("data") or {})]
    net_conf = json.loads(cms[0]["data"]["net-conf.json"]) if len(cms) == 1 else {}
    if net_conf.get("Network") != cidr or net_conf.get("Backend", {}).get("Type") != "host-gw":
        raise OverlayError(f"rendered flannel net-conf.json is {net_conf}")
    _, container = find_flanneld(docs)
    host, port = split_api_server(api_server)
    want = {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": port,
        "FLANNELD_IFACE_REGEX": iface_regex,
    }
    for name, value in want.items():
        got = env_value(docs, container, name)
        if got != value:
            raise OverlayError(f"rendered flannel gives {name}={got!r}, wanted {value!r}")


# --- kubeadm --------------------------------------------------------------------------------


def pod_subnet(cluster_configuration: str) -> str:
    """networking.podSubnet of kubeadm's ClusterConfiguration: the CIDR kubeadm really used
    (read back from the cluster, so a re-provision with other settings cannot disagree)."""
    doc = yaml.safe_load(cluster_configuration) or {}
    subnet = (doc.get("networking") or {}).get("podSubnet") if isinstance(doc, dict) else None
    if not subnet:
        raise OverlayError("the ClusterConfiguration has no networking.podSubnet")
    if "," in str(subnet):
        raise OverlayError(f"dual-stack podSubnet {subnet!r}: ipvsproxy is IPv4 only for now")
    return check_cidr(str(subnet))


# --- command line ---------------------------------------------------------------------------


# deploy/'s image, tagged with the package's version (the Vagrantfile passes the same IMAGE).
IMAGE = (
    "ipvsproxy:"
    + tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())[
        "project"
    ]["version"]
)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ipvsproxy", help="overlay over deploy/")
    p.add_argument("--base", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cluster-cidr", required=True)
    p.add_argument("--api-server", required=True)
    p.add_argument("--image", default=IMAGE)
    p.add_argument("--privileged", action="store_true")
    p.add_argument("--kubectl", default="kubectl")
    f = sub.add_parser("flannel", help="overlay over flannel's kube-flannel.yml")
    f.add_argument("--manifest", type=Path, required=True)
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("--pod-cidr", required=True)
    f.add_argument("--api-server", required=True)
    f.add_argument("--iface-regex", required=True)
    f.add_argument("--kubectl", default="kubectl")
    sub.add_parser("pod-subnet", help="print networking.podSubnet of a ClusterConfiguration")
    t = sub.add_parser("target", help="print where ipvsproxy's container is in a base")
    t.add_argument("--base", type=Path, required=True)
    t.add_argument("--image", default=IMAGE)
    t.add_argument("--kubectl", default="kubectl")
    args = parser.parse_args(argv)
    try:
        if args.command == "pod-subnet":
            print(pod_subnet(sys.stdin.read()))
        elif args.command == "target":
            print(proxy_target(kustomize(args.kubectl, args.base), args.image).env_file(), end="")
        elif args.command == "ipvsproxy":
            cidr = check_cidr(args.cluster_cidr)
            docs = kustomize(args.kubectl, args.base)
            overlay, target = ipvsproxy_overlay(
                docs, args.base, args.out, cidr, args.api_server, args.image, args.privileged
            )
            write(args.out, overlay)
            verify_ipvsproxy(
                kustomize(args.kubectl, args.out),
                cidr,
                args.api_server,
                args.image,
                args.privileged,
            )
            (args.out / "ipvsproxy.env").write_text(target.env_file())
            print(target.env_file(), end="")
        else:
            cidr = check_cidr(args.pod_cidr)
            args.out.mkdir(parents=True, exist_ok=True)
            local = args.out / "kube-flannel.yml"
            if args.manifest.resolve() != local.resolve():
                shutil.copyfile(args.manifest, local)
            docs = load_docs(local.read_text())
            write(
                args.out,
                flannel_overlay(docs, local.name, cidr, args.api_server, args.iface_regex),
            )
            verify_flannel(
                kustomize(args.kubectl, args.out), cidr, args.api_server, args.iface_regex
            )
    except (OverlayError, OSError, yaml.YAMLError, json.JSONDecodeError) as exc:
        print(f"overlay.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
