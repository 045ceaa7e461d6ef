"""Checks of the Vagrant lab (vagrant/) that need no VM.

Why these: no development machine of this project can boot a VM, so `vagrant up` never runs
here. What can run are the checks that would catch the mistakes that otherwise show only after
twenty minutes of provisioning on someone else's machine: a Ruby syntax error, a shell script
shellcheck rejects, a machine or address the scripts do not expect, a setting a script
requires that the Vagrantfile does not pass, a file the scripts use that is not in the
repository, a `kubeadm init` that would install kube-proxy, an overlay that kustomize renders
without the values it was written for. Every checking function is also run on a deliberately
broken input, to show it reports what it is there to catch.

ruby and shellcheck are installed by lab/install-host-packages.sh; a missing one fails these
tests (it never skips them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

REPO = Path(__file__).resolve().parents[2]
VAGRANT = REPO / "vagrant"
VAGRANTFILE = VAGRANT / "Vagrantfile"
PROVISION = VAGRANT / "provision"
OVERLAY = PROVISION / "overlay.py"
RUBY = Path("/usr/bin/ruby")
SHELLCHECK = Path("/usr/bin/shellcheck")
KUBECTL = Path(sys.executable).parent / "kubectl"

MACHINES = {"cp": "192.168.56.10", "worker1": "192.168.56.11", "worker2": "192.168.56.12"}
ROLES = {"cp": "control-plane", "worker1": "worker", "worker2": "worker"}
# The image deploy/ names: ipvsproxy tagged with the package's version.
IMAGE = f"ipvsproxy:{tomllib.loads((REPO / 'pyproject.toml').read_text())['project']['version']}"
IPVS_MODULES = {"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "nf_conntrack", "br_netfilter"}


def tool(path: Path) -> str:
    """The tool's path; a failure (not a skip) when it is missing, as the brief of these checks
    is that they always run."""
    assert path.exists(), f"{path} is missing: run `sh lab/install-host-packages.sh`"
    return str(path)


def run(args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=False, **kwargs)


# --- Ruby syntax -------------------------------------------------------------------------------


def ruby_syntax_errors(path: Path) -> str:
    """Empty when `ruby -c` accepts the file, else ruby's complaint."""
    proc = run([tool(RUBY), "-c", str(path)])
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr


def test_vagrantfile_is_valid_ruby() -> None:
    assert ruby_syntax_errors(VAGRANTFILE) == ""


def test_ruby_syntax_check_reports_a_broken_vagrantfile(tmp_path: Path) -> None:
    broken = tmp_path / "Vagrantfile"
    text = VAGRANTFILE.read_text()
    last_end = text.rstrip().rfind("end")
    broken.write_text(text[:last_end])  # the block of Vagrant.configure is never closed
    assert "syntax error" in ruby_syntax_errors(broken)


# --- shellcheck --------------------------------------------------------------------------------


def shell_scripts(root: Path) -> list[Path]:
    """Every shell script under root: *.sh, and executables whose first line names a shell.
    Vagrant's own state (.vagrant) and the cluster's files (.cluster) are not ours."""
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or {".vagrant", ".cluster"} & set(path.relative_to(root).parts):
            continue
        first = path.read_text(errors="replace").partition("\n")[0]
        if path.suffix == ".sh" or re.match(r"#!.*\b(ba)?sh\b", first):
            found.append(path)
    return found


def shellcheck_findings(paths: Sequence[Path]) -> str:
    """Empty when shellcheck (all severities, following sourced files) accepts every script."""
    proc = run([tool(SHELLCHECK), "-x", "--format=gcc", *map(str, paths)], cwd=REPO)
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr


def test_shell_scripts_pass_shellcheck() -> None:
    scripts = shell_scripts(VAGRANT)
    names = {p.relative_to(VAGRANT).as_posix() for p in scripts}
    expected = {
        "provision/common.sh",
        "provision/control-plane.sh",
        "provision/worker.sh",
        "run-e2e.sh",
    }
    assert expected <= names
    assert shellcheck_findings(scripts) == ""


def test_shellcheck_reports_an_unquoted_variable(tmp_path: Path) -> None:
    script = tmp_path / "broken.sh"
    script.write_text("#!/usr/bin/env bash\nset -euo pipefail\ndir=$1\nrm -rf $dir/tmp\n")
    assert shell_scripts(tmp_path) == [script]
    assert "SC2086" in shellcheck_findings([script])


def test_scripts_are_executable() -> None:
    """Vagrant runs the role scripts with `bash FILE`, but run-e2e.sh is run by path."""
    for path in [VAGRANT / "run-e2e.sh", PROVISION / "control-plane.sh", PROVISION / "worker.sh"]:
        assert os.access(path, os.X_OK), path


# --- the machines the Vagrantfile defines ------------------------------------------------------

# Loads a Vagrantfile against a stub of Vagrant.configure that records every call made on the
# configuration objects, and prints the record as JSON. Blocks are called (so `define` and
# `provider` blocks run) except a trigger's `ruby` block, which would act on the host.
RUBY_STUB = r"""
require "json"

class Recorder
  def initialize
    @attrs = {}
    @children = {}
    @calls = []
  end

  def method_missing(name, *args, **kwargs, &block)
    key = name.to_s
    if key.end_with?("=")
      @attrs[key.chomp("=")] = args.first
      return args.first
    end
    if args.empty? && kwargs.empty? && block.nil?
      return @children[key] ||= Recorder.new
    end
    child = Recorder.new
    @calls << { "method" => key, "args" => args, "kwargs" => kwargs, "block" => !block.nil?,
                "child" => child }
    block.call(child) if block && key != "ruby"
    child
  end

  def respond_to_missing?(_name, _private = false)
    true
  end

  def to_json_data
    {
      "attrs" => Recorder.plain(@attrs),
      "children" => @children.transform_values(&:to_json_data),
      "calls" => @calls.map { |c| Recorder.plain(c.merge("child" => c["child"].to_json_data)) },
    }
  end

  def self.plain(value)
    case value
    when Hash then value.to_h { |k, v| [k.to_s, plain(v)] }
    when Array then value.map { |v| plain(v) }
    when Symbol then value.to_s
    else value
    end
  end
end

module Vagrant
  @configs = []

  def self.configure(version)
    root = Recorder.new
    yield root
    @configs << { "version" => version.to_s, "config" => root.to_json_data }
  end

  def self.configs
    @configs
  end
end

load ARGV.fetch(0)
puts JSON.generate(Vagrant.configs)
"""

Record = dict[str, Any]


def vagrant_record(vagrantfile: Path, env: Mapping[str, str] | None = None) -> Record:
    """What the Vagrantfile configures, as recorded by RUBY_STUB (the one configure call)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("IPVSPROXY_")}
    environ.update(env or {})
    proc = run([tool(RUBY), "-e", RUBY_STUB, str(vagrantfile)], env=environ)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    configs = json.loads(proc.stdout)
    assert len(configs) == 1 and configs[0]["version"] == "2", configs
    config: Record = configs[0]["config"]
    return config


def calls(record: Record, method: str) -> list[Record]:
    return [c for c in record["calls"] if c["method"] == method]


def vm(record: Record) -> Record:
    child: Record = record["children"].get("vm", {"attrs": {}, "children": {}, "calls": []})
    return child


def machines(config: Record) -> dict[str, Record]:
    """name -> {ips, hostname, primary, providers: {name: attrs}, provisioners: [kwargs]}."""
    result: dict[str, Record] = {}
    for define in calls(vm(config), "define"):
        node = vm(define["child"])
        result[str(define["args"][0])] = {
            "ips": [
                n["kwargs"].get("ip")
                for n in calls(node, "network")
                if n["args"] == ["private_network"]
            ],
            "hostname": node["attrs"].get("hostname"),
            "primary": bool(define["kwargs"].get("primary")),
            "providers": {str(p["args"][0]): p["child"]["attrs"] for p in calls(node, "provider")},
            "provisioners": [p["kwargs"] for p in calls(node, "provision")],
        }
    return result


def machine_problems(found: Mapping[str, Record]) -> list[str]:
    """What differs from the three machines, addresses and roles the scripts expect."""
    problems = []
    if set(found) != set(MACHINES):
        problems.append(f"machines {sorted(found)}, expected {sorted(MACHINES)}")
    for name, machine in found.items():
        want_ip = MACHINES.get(name)
        if machine["ips"] != [want_ip]:
            problems.append(f"{name}: private-network addresses {machine['ips']}, want [{want_ip}]")
        if machine["hostname"] != name:
            problems.append(f"{name}: hostname {machine['hostname']!r}")
        if len(machine["provisioners"]) != 1:
            problems.append(f"{name}: {len(machine['provisioners'])} provisioners, want 1")
            continue
        env = machine["provisioners"][0].get("env", {})
        if env.get("NODE_NAME") != name or env.get("NODE_IP") != want_ip:
            problems.append(
                f"{name}: NODE_NAME/NODE_IP {env.get('NODE_NAME')}/{env.get('NODE_IP')}"
            )
        if env.get("CP_IP") != MACHINES["cp"]:
            problems.append(f"{name}: CP_IP {env.get('CP_IP')}, want {MACHINES['cp']}")
        inline = str(machine["provisioners"][0].get("inline", ""))
        if f"/vagrant/vagrant/provision/{ROLES.get(name)}.sh" not in inline:
            problems.append(f"{name}: runs {inline!r}, not the {ROLES.get(name)} script")
    return problems


def test_vagrantfile_defines_the_three_machines() -> None:
    found = machines(vagrant_record(VAGRANTFILE))
    assert machine_problems(found) == []
    assert [name for name, m in found.items() if m["primary"]] == ["cp"]
    for machine in found.values():
        assert set(machine["providers"]) == {"libvirt", "virtualbox"}
        script = re.search(r"/vagrant/(\S+\.sh)", machine["provisioners"][0]["inline"])
        assert script and (REPO / script.group(1)).is_file(), machine["provisioners"]


def test_machine_check_reports_a_fourth_machine_and_a_wrong_address(tmp_path: Path) -> None:
    text = VAGRANTFILE.read_text()
    anchor = '  { name: "worker2", ip: "#{network}.12", role: "worker" }.merge(worker_resources),\n'
    assert anchor in text
    broken = text.replace(
        anchor,
        anchor.replace("worker2", "worker3").replace(".12", ".13") + anchor.replace(".12", ".21"),
    )
    (tmp_path / "Vagrantfile").write_text(broken)
    problems = machine_problems(machines(vagrant_record(tmp_path / "Vagrantfile")))
    assert any("worker3" in p for p in problems), problems
    assert any("192.168.56.21" in p for p in problems), problems


def test_resources_have_defaults_and_follow_the_environment() -> None:
    default = machines(vagrant_record(VAGRANTFILE))
    for name, machine in default.items():
        for provider in ("libvirt", "virtualbox"):
            attrs = machine["providers"][provider]
            assert attrs["cpus"] >= 2, (name, provider)  # kubeadm's preflight wants 2
            assert attrs["memory"] >= 2048, (name, provider)
    env = {
        "IPVSPROXY_CP_CPUS": "6",
        "IPVSPROXY_CP_MEMORY": "8192",
        "IPVSPROXY_WORKER_CPUS": "3",
        "IPVSPROXY_WORKER_MEMORY": "3072",
    }
    changed = machines(vagrant_record(VAGRANTFILE, env))
    for provider in ("libvirt", "virtualbox"):
        assert changed["cp"]["providers"][provider]["cpus"] == 6
        assert changed["cp"]["providers"][provider]["memory"] == 8192
        for worker in ("worker1", "worker2"):
            assert changed[worker]["providers"][provider]["cpus"] == 3
            assert changed[worker]["providers"][provider]["memory"] == 3072


def test_bad_resource_setting_stops_vagrant() -> None:
    proc = run(
        [tool(RUBY), "-e", RUBY_STUB, str(VAGRANTFILE)],
        env={**os.environ, "IPVSPROXY_WORKER_MEMORY": "2G"},
    )
    assert proc.returncode != 0
    assert "IPVSPROXY_WORKER_MEMORY" in proc.stderr


def test_repository_is_shared_two_way_at_vagrant() -> None:
    """The control plane writes the join command for the workers into the shared folder: a
    one-way (rsync) share would leave them waiting forever."""
    folders = calls(vm(vagrant_record(VAGRANTFILE)), "synced_folder")
    assert [f["args"][:2] for f in folders] == [["..", "/vagrant"]]
    options = folders[0]["args"][2] if len(folders[0]["args"]) > 2 else folders[0]["kwargs"]
    assert options["type"] == "nfs"


# --- settings the scripts require --------------------------------------------------------------


def required_settings(*scripts: Path) -> set[str]:
    """The variables named by `require_env` in the scripts."""
    names: set[str] = set()
    for script in scripts:
        for line in re.findall(r"^\s*require_env ([A-Z0-9_ ]+)$", script.read_text(), re.M):
            names.update(line.split())
    return names


def missing_settings(env: Mapping[str, str], role: str) -> set[str]:
    return required_settings(PROVISION / "common.sh", PROVISION / f"{role}.sh") - set(env)


def test_vagrantfile_passes_every_setting_the_scripts_require() -> None:
    found = machines(vagrant_record(VAGRANTFILE))
    assert required_settings(PROVISION / "common.sh") >= {"NODE_IP", "K8S_VERSION", "IMAGE"}
    for name, machine in found.items():
        env = machine["provisioners"][0]["env"]
        assert missing_settings(env, ROLES[name]) == set(), name


def test_the_lab_builds_and_runs_the_image_deploy_names() -> None:
    """The image the control plane builds and imports is the one deploy/'s DaemonSet runs (its
    tag is the package's version), and overlay.py looks for that one by default."""
    for machine in machines(vagrant_record(VAGRANTFILE)).values():
        assert machine["provisioners"][0]["env"]["IMAGE"] == IMAGE
    assert f'p.add_argument("--image", default="{IMAGE}")' in OVERLAY.read_text()


def test_settings_check_reports_a_missing_one() -> None:
    env = machines(vagrant_record(VAGRANTFILE))["cp"]["provisioners"][0]["env"]
    del env["POD_CIDR"]
    assert missing_settings(env, "control-plane") == {"POD_CIDR"}


# --- references into the repository ------------------------------------------------------------

REFERENCE = re.compile(r"(?:(?<![\w.-])/vagrant|\$\{?REPO_DIR\}?|\$\{?PROVISION_DIR\}?)/([\w./-]+)")


def references(text: str) -> set[str]:
    """Repository paths a script uses, through /vagrant, $REPO_DIR or $PROVISION_DIR; the
    files the lab writes at run time (vagrant/.cluster) excluded."""
    found = set()
    for match in REFERENCE.finditer(text):
        path = match.group(1).rstrip(".")
        if match.group(0).startswith(("$PROVISION_DIR", "${PROVISION_DIR}")):
            path = f"vagrant/provision/{path}"
        if not path.startswith("vagrant/.cluster") and path != "vagrant/.vagrant":
            found.add(path)
    return found


def missing_references(texts: Mapping[str, str]) -> list[str]:
    return sorted(
        f"{name}: {path}"
        for name, text in texts.items()
        for path in references(text)
        if not (REPO / path).exists()
    )


def lab_texts() -> dict[str, str]:
    files = [*shell_scripts(VAGRANT), VAGRANTFILE, OVERLAY]
    return {p.relative_to(REPO).as_posix(): p.read_text() for p in files}


def test_scripts_reference_files_that_exist() -> None:
    texts = lab_texts()
    used = set().union(*(references(t) for t in texts.values()))
    assert {"deploy/Containerfile", "deploy", "vagrant/provision/overlay.py"} <= used
    assert missing_references(texts) == []
    # What `kubectl apply -k /vagrant/deploy` and the image build need from the deploy work.
    for path in ("deploy/kustomization.yaml", "deploy/Containerfile"):
        assert (REPO / path).is_file(), f"{path} is not in the repository (yet)"


def test_reference_check_reports_a_missing_file() -> None:
    text = 'buildah build -f "$REPO_DIR/deploy/Containerfile.missing" /vagrant/deploy'
    assert missing_references({"sample.sh": text}) == ["sample.sh: deploy/Containerfile.missing"]


# --- kubeadm and the kernel --------------------------------------------------------------------


def kubeadm_init_problems(script: str) -> list[str]:
    """What is wrong with the script's `kubeadm init` calls (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", script)
    inits = [line for line in joined.splitlines() if re.match(r"\s*kubeadm init\b", line)]
    if not inits:
        return ["no kubeadm init"]
    problems = []
    for line in inits:
        if "--skip-phases=addon/kube-proxy" not in line:
            problems.append(f"kube-proxy not skipped: {line.strip()}")
        if '--apiserver-advertise-address="$NODE_IP"' not in line:
            problems.append(f"API server not advertised on the node address: {line.strip()}")
    return problems


def test_kubeadm_init_skips_kube_proxy() -> None:
    assert kubeadm_init_problems((PROVISION / "control-plane.sh").read_text()) == []


def test_kubeadm_check_reports_an_init_that_installs_kube_proxy() -> None:
    text = (
        (PROVISION / "control-plane.sh")
        .read_text()
        .replace(" \\\n        --skip-phases=addon/kube-proxy", "")
    )
    problems = kubeadm_init_problems(text)
    assert len(problems) == 1 and "kube-proxy not skipped" in problems[0]
    assert kubeadm_init_problems("kubeadm join x") == ["no kubeadm init"]


def kernel_modules(common: str) -> set[str]:
    m = re.search(r"^KERNEL_MODULES=\(([^)]*)\)", common, re.M)
    return set(m.group(1).split()) if m else set()


def test_ipvs_modules_are_loaded_now_and_at_boot() -> None:
    common = (PROVISION / "common.sh").read_text()
    assert kernel_modules(common) >= IPVS_MODULES
    assert "/etc/modules-load.d/" in common and 'modprobe "$module"' in common
    assert IPVS_MODULES - kernel_modules(common.replace(" ip_vs_sh", "")) == {"ip_vs_sh"}


def test_run_e2e_runs_the_e2e_tests_with_the_kubeconfig() -> None:
    text = (VAGRANT / "run-e2e.sh").read_text()
    assert (
        "-m venv" in text and 'pip install -q -e "$repo" --group "$repo/pyproject.toml:dev"' in text
    )
    assert re.search(r'-m pytest tests/e2e --e2e-kubeconfig "\$kubeconfig"', text)


# --- provision/overlay.py ----------------------------------------------------------------------


def overlay_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vagrant_overlay", OVERLAY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def overlay(*args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, str(OVERLAY), *args, "--kubectl", tool(KUBECTL)])


def kustomize(directory: Path) -> list[dict[str, Any]]:
    proc = run([tool(KUBECTL), "kustomize", str(directory)])
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def by_kind(docs: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def proxy_config(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    configs = [
        yaml.safe_load(v)
        for cm in by_kind(docs, "ConfigMap")
        for v in cm.get("data", {}).values()
        if "KubeProxyConfiguration" in v
    ]
    assert len(configs) == 1
    config: dict[str, Any] = configs[0]
    return config


def test_overlay_over_deploy_sets_cluster_cidr_and_api_server(tmp_path: Path) -> None:
    out = tmp_path / "overlay"
    proc = overlay(
        "ipvsproxy",
        *("--base", str(REPO / "deploy"), "--out", str(out)),
        *("--cluster-cidr", "10.32.0.0/16", "--api-server", "192.168.56.10:6443"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "IPVSPROXY_DAEMONSET=" in proc.stdout
    assert (out / "ipvsproxy.env").read_text() == proc.stdout
    docs = kustomize(out)
    assert proxy_config(docs)["clusterCIDR"] == "10.32.0.0/16"
    mod = overlay_module()
    (ds,) = [d for d in by_kind(docs, "DaemonSet") if d["metadata"]["name"] in proc.stdout]
    container = mod.find_proxy(docs, IMAGE)[1]
    assert mod.env_value(docs, container, "KUBERNETES_SERVICE_HOST") == "192.168.56.10"
    assert mod.env_value(docs, container, "KUBERNETES_SERVICE_PORT") == "6443"
    # Everything else in deploy/ is as it was: the overlay only adds the values. The generated
    # ConfigMap's name differs by its hash suffix, which follows the values.
    base = kustomize(REPO / "deploy")

    def names(rendered: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(d["kind"], re.sub(r"-[a-z0-9]{10}$", "", d["metadata"]["name"])) for d in rendered]

    assert names(docs) == names(base)
    assert (
        by_kind(docs, "ConfigMap")[0]["metadata"]["name"]
        != by_kind(base, "ConfigMap")[0]["metadata"]["name"]
    )
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE


def test_privileged_overlay_replaces_the_security_context(tmp_path: Path) -> None:
    """IPVSPROXY_PRIVILEGED=1 reaches the control-plane script, whose overlay then makes the
    container privileged (and only that: privileged with allowPrivilegeEscalation false is
    rejected by the API server), keeping the API server address."""
    found = machines(vagrant_record(VAGRANTFILE, {"IPVSPROXY_PRIVILEGED": "1"}))
    assert found["cp"]["provisioners"][0]["env"]["PRIVILEGED"] == "1"
    assert (
        machines(vagrant_record(VAGRANTFILE))["cp"]["provisioners"][0]["env"]["PRIVILEGED"] == "0"
    )
    out = tmp_path / "overlay"
    proc = overlay(
        "ipvsproxy",
        *("--base", str(REPO / "deploy"), "--out", str(out), "--privileged"),
        *("--cluster-cidr", "10.32.0.0/16", "--api-server", "192.168.56.10:6443"),
    )
    assert proc.returncode == 0, proc.stderr
    docs = kustomize(out)
    mod = overlay_module()
    container = mod.find_proxy(docs, IMAGE)[1]
    assert container["securityContext"] == {"privileged": True}
    assert mod.env_value(docs, container, "KUBERNETES_SERVICE_HOST") == "192.168.56.10"


SAMPLE_DAEMONSET = """\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: proxy}
spec:
  selector: {matchLabels: {app: proxy}}
  template:
    metadata: {labels: {app: proxy}}
    spec:
      containers:
      - name: main
        image: ipvsproxy:dev
        env: [{name: KUBERNETES_SERVICE_HOST, value: 10.96.0.1}]
      volumes: [{name: config, configMap: {name: proxy-config}}]
"""


def sample_base(root: Path, config: str) -> Path:
    """A base whose KubeProxyConfiguration comes from a configMapGenerator (so it is rendered
    with a hash suffix) and whose DaemonSet sets KUBERNETES_SERVICE_HOST as a literal."""
    base = root / "base"
    base.mkdir()
    (base / "config.conf").write_text(config)
    (base / "ds.yaml").write_text(SAMPLE_DAEMONSET)
    (base / "kustomization.yaml").write_text(
        "namespace: lab\nresources: [ds.yaml]\n"
        "configMapGenerator:\n- name: proxy-config\n  files: [config.conf]\n"
    )
    return base


def test_overlay_reaches_generated_configmaps_and_literal_env(tmp_path: Path) -> None:
    config = (
        "# the comment stays\nkind: KubeProxyConfiguration\nmode: ipvs\nclusterCIDR: 10.0.0.0/8\n"
    )
    base = sample_base(tmp_path, config)
    out = tmp_path / "overlay"
    proc = overlay(
        "ipvsproxy",
        *("--base", str(base), "--out", str(out), "--cluster-cidr", "10.244.0.0/16"),
        *("--api-server", "192.168.56.10:6443", "--privileged"),
        *("--image", "ipvsproxy:dev"),  # SAMPLE_DAEMONSET's, not deploy/'s
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "IPVSPROXY_NAMESPACE=lab",
        "IPVSPROXY_DAEMONSET=proxy",
        "IPVSPROXY_CONTAINER=main",
    ]
    docs = kustomize(out)
    (cm,) = by_kind(docs, "ConfigMap")
    # Line for line, comment included (kustomize may drop the final newline of patched data).
    want = config.replace("10.0.0.0/8", "10.244.0.0/16")
    assert cm["data"]["config.conf"].rstrip("\n") == want.rstrip("\n")
    (ds,) = by_kind(docs, "DaemonSet")
    # kustomize renamed the ConfigMap (new content, new hash) and the reference followed.
    assert (
        ds["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]
    )
    # Two patches of the same container (env, securityContext) merged into one, both kept.
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"KUBERNETES_SERVICE_HOST": "192.168.56.10", "KUBERNETES_SERVICE_PORT": "6443"}
    assert container["securityContext"] == {"privileged": True}


def test_overlay_refuses_what_it_cannot_set(tmp_path: Path) -> None:
    base = sample_base(tmp_path, "kind: SomethingElse\n")
    proc = overlay(
        "ipvsproxy",
        *("--base", str(base), "--out", str(tmp_path / "o1"), "--cluster-cidr", "10.244.0.0/16"),
        *("--api-server", "192.168.56.10:6443"),
    )
    assert proc.returncode == 1
    assert "KubeProxyConfiguration" in proc.stderr
    proc = overlay(
        "ipvsproxy",
        *("--base", str(REPO / "deploy"), "--out", str(tmp_path / "o2")),
        *("--cluster-cidr", "10.244.0.0/16", "--api-server", "192.168.56.10:6443"),
        *("--image", "example.org/other:1"),
    )
    assert proc.returncode == 1
    assert "image example.org/other:1" in proc.stderr


def test_overlay_verification_catches_a_patch_that_did_nothing() -> None:
    """kustomize applies a patch aimed at a name it does not find as a silent no-op; the
    verification is what turns that into an error. The unpatched base stands for it."""
    mod = overlay_module()
    base = kustomize(REPO / "deploy")
    with pytest.raises(mod.OverlayError, match="clusterCIDR"):
        mod.verify_ipvsproxy(base, "10.32.0.0/16", "192.168.56.10:6443", IMAGE)
    patched_cidr = [dict(d) for d in base]
    for cm in by_kind(patched_cidr, "ConfigMap"):
        for key, value in cm.get("data", {}).items():
            if "KubeProxyConfiguration" in value:
                cm["data"] = {**cm["data"], key: value.replace("10.244.0.0/16", "10.32.0.0/16")}
    with pytest.raises(mod.OverlayError, match="KUBERNETES_SERVICE_HOST"):
        mod.verify_ipvsproxy(patched_cidr, "10.32.0.0/16", "192.168.56.10:6443", IMAGE)


FLANNEL_LIKE = """\
apiVersion: v1
kind: Namespace
metadata: {name: kube-flannel}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: kube-flannel-cfg, namespace: kube-flannel}
data:
  net-conf.json: |
    {"Network": "10.244.0.0/16", "EnableNFTables": false, "Backend": {"Type": "vxlan"}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-flannel-ds, namespace: kube-flannel}
spec:
  selector: {matchLabels: {app: flannel}}
  template:
    metadata: {labels: {app: flannel}}
    spec:
      containers:
      - name: kube-flannel
        image: ghcr.io/flannel-io/flannel:v0.28.9
        command: [/opt/bin/flanneld]
        args: [--ip-masq, --kube-subnet-mgr]
        env:
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
"""


def test_flannel_overlay_uses_host_gw_and_the_real_api_server(tmp_path: Path) -> None:
    manifest = tmp_path / "kube-flannel.yml"
    manifest.write_text(FLANNEL_LIKE)
    out = tmp_path / "flannel"
    regex = r"^192\.168\.56\.[0-9]+$"
    proc = overlay(
        "flannel",
        *("--manifest", str(manifest), "--out", str(out), "--pod-cidr", "10.32.0.0/16"),
        *("--api-server", "192.168.56.10:6443", "--iface-regex", regex),
    )
    assert proc.returncode == 0, proc.stderr
    docs = kustomize(out)
    (cm,) = by_kind(docs, "ConfigMap")
    assert json.loads(cm["data"]["net-conf.json"]) == {
        "Network": "10.32.0.0/16",
        "EnableNFTables": False,
        "Backend": {"Type": "host-gw"},
    }
    (ds,) = by_kind(docs, "DaemonSet")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env == {
        "KUBERNETES_SERVICE_HOST": "192.168.56.10",
        "KUBERNETES_SERVICE_PORT": "6443",
        "FLANNELD_IFACE_REGEX": regex,
        "POD_NAME": None,
    }
    assert container["args"] == ["--ip-masq", "--kube-subnet-mgr"]
    assert re.fullmatch(regex, "192.168.56.11") and not re.fullmatch(regex, "10.0.2.15")


def test_flannel_regex_from_the_scripts_matches_only_the_private_network() -> None:
    proc = run(
        ["bash", "-c", f'. "{PROVISION}/common.sh" && private_iface_regex'],
        env={**os.environ, "NETWORK_PREFIX": "192.168.56"},
    )
    assert proc.returncode == 0, proc.stderr
    regex = proc.stdout.strip()
    assert all(re.fullmatch(regex, ip) for ip in MACHINES.values())
    assert not any(re.fullmatch(regex, ip) for ip in ("10.0.2.15", "192.168.121.5", "192x168.56.1"))


def test_pod_subnet_is_read_from_the_cluster_configuration() -> None:
    cluster_configuration = (
        "networking:\n  podSubnet: 10.244.0.0/16\n  serviceSubnet: 10.96.0.0/12\n"
    )
    proc = run([sys.executable, str(OVERLAY), "pod-subnet"], input=cluster_configuration)
    assert (proc.returncode, proc.stdout) == (0, "10.244.0.0/16\n")
    proc = run([sys.executable, str(OVERLAY), "pod-subnet"], input="networking: {}\n")
    assert proc.returncode == 1 and "podSubnet" in proc.stderr


def test_join_command_pattern_accepts_kubeadm_output_only() -> None:
    """Workers run the join command from the shared folder only if it has kubeadm's shape."""
    good = (
        "kubeadm join 192.168.56.10:6443 --token abcdef.0123456789abcdef "
        "--discovery-token-ca-cert-hash sha256:" + "0" * 64
    )
    script = f'. "{PROVISION}/common.sh"; [[ $1 =~ $JOIN_COMMAND_RE ]]'
    assert run(["bash", "-c", script, "-", good]).returncode == 0
    assert run(["bash", "-c", script, "-", good + "; rm -rf /"]).returncode != 0


def common_sh(snippet: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a snippet of bash with provision/common.sh sourced (only its pure helpers)."""
    script = f'set -euo pipefail; . "{PROVISION}/common.sh"; {snippet}'
    return run(["bash", "-c", script, "-", *args])


def test_image_names_agree_between_import_and_daemonset() -> None:
    """The image is imported under runtime_image_ref's name and the DaemonSet is found by
    overlay.py's normalize_image: were they to disagree, the kubelet would try to pull."""
    mod = overlay_module()
    for ref in ("ipvsproxy:dev", "library/ipvsproxy:dev", "ghcr.io/x/ipvsproxy:1", "localhost/i:d"):
        proc = common_sh('runtime_image_ref "$1"', ref)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == mod.normalize_image(ref), ref
    assert mod.normalize_image("ipvsproxy:dev") == "docker.io/library/ipvsproxy:dev"


def test_env_file_values_must_be_kubernetes_names(tmp_path: Path) -> None:
    """Values read from the shared folder end up in kubectl and crictl arguments."""
    env = tmp_path / "ipvsproxy.env"
    env.write_text("IPVSPROXY_NAMESPACE=kube-system\nIPVSPROXY_DAEMONSET=$(reboot)\n")
    ok = common_sh('env_file_get "$1" IPVSPROXY_NAMESPACE', str(env))
    assert (ok.returncode, ok.stdout) == (0, "kube-system\n")
    assert common_sh('env_file_get "$1" IPVSPROXY_DAEMONSET', str(env)).returncode == 1
    assert common_sh('env_file_get "$1" IPVSPROXY_CONTAINER', str(env)).returncode == 1


def test_install_file_reports_whether_it_changed_the_file(tmp_path: Path) -> None:
    """Services are restarted only when their configuration changed; a re-provision that
    changes nothing restarts nothing."""
    target = tmp_path / "etc" / "x.conf"
    snippet = (
        'if printf "%s\\n" "$2" | install_file 0640 "$1"; then echo changed; else echo same; fi'
    )
    outputs = [common_sh(snippet, str(target), v).stdout.strip() for v in ("a", "a", "b")]
    assert outputs == ["changed", "same", "changed"]
    assert target.read_text() == "b\n"
    assert oct(target.stat().st_mode & 0o777) == "0o640"
