"""Checks of the Vagrant lab (vagrant/) that need no VM.

Why these: no development machine of this project can boot a VM, so `vagrant up` never runs
here. What can run are the checks that would catch the mistakes that otherwise show only after
twenty minutes of provisioning on someone else's machine: a Ruby syntax error, a shell script
shellcheck rejects, a machine or address the scripts do not expect, a setting a script
requires that the Vagrantfile does not pass, a file the scripts use that is not in the
repository, a `kubeadm init` that would install kube-proxy, an overlay that kustomize renders
without the values it was written for. Every checking function is also run on a deliberately
broken input, to show it reports what it is there to catch.

The real `vagrant validate` runs too, once per provider (libvirt and VirtualBox) and synced
folder choice: it loads the Vagrantfile with Vagrant's own configuration classes and the
providers' plugins, which catch what a Ruby stub cannot (a misspelt setting, an option a
provider does not have, a synced folder type that cannot work with the provider). It boots
nothing and downloads no box.

ruby, shellcheck, openssl, rsync, vagrant and vagrant-libvirt are installed by
lab/install-host-packages.sh; a missing one fails these tests (it never skips them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
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
VAGRANT_CLI = Path("/usr/bin/vagrant")
OPENSSL = Path("/usr/bin/openssl")
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
    """name -> {ips, hostname, primary, providers: {name: attrs}, provisioners: [kwargs],
    folders: [args of synced_folder], triggers: [(timing, actions)]}."""
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
            "folders": [f["args"] for f in calls(node, "synced_folder")],
            "triggers": triggers(define["child"]),
        }
    return result


def triggers(record: Record) -> list[tuple[str, list[str]]]:
    """The triggers a configuration (or a machine's) defines: (before|after, [actions])."""
    found = []
    for timing in ("before", "after"):
        for call in calls(record.get("children", {}).get("trigger", {"calls": []}), timing):
            found.append((timing, [str(a) for a in call["args"][0:1] for a in _listed(a)]))
    return found


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


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
    copy = tmp_path / "vagrant" / "Vagrantfile"
    copy.parent.mkdir()
    copy.write_text(broken)
    shutil.copy(REPO / "pyproject.toml", tmp_path)  # where the Vagrantfile reads the version
    problems = machine_problems(machines(vagrant_record(copy)))
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


def folder_options(env: Mapping[str, str] | None = None) -> dict[str, Record]:
    """Each machine's options for its one synced folder, the repository at /vagrant."""
    options = {}
    for name, machine in machines(vagrant_record(VAGRANTFILE, env)).items():
        assert [f[:2] for f in machine["folders"]] == [["..", "/vagrant"]], name
        options[name] = machine["folders"][0][2]
    assert calls(vm(vagrant_record(VAGRANTFILE, env)), "synced_folder") == []
    return options


def test_repository_reaches_the_machines_by_rsync_by_default() -> None:
    """rsync needs no NFS server and works with both providers. It is one-way, which is
    enough: the machines read vagrant/.cluster, nothing on them writes there. What stays on the
    host: Git objects and the host's virtual environment, the files the host copied out of
    `cp`, and, for the workers, the CA's key."""
    options = folder_options()
    for name, opts in options.items():
        assert opts["type"] == "rsync", name
        excludes = opts["rsync__exclude"]
        assert {"/.git/", "/.venv/", ".vagrant/", "/vagrant/.cluster/admin.conf"} <= set(excludes)
        assert not any("bootstrap-token" in e or "ca.crt" in e for e in excludes), name
        assert ("/vagrant/.cluster/ca.key" in excludes) == (ROLES[name] == "worker"), name


def test_other_synced_folders_stay_selectable() -> None:
    nfs = folder_options({"IPVSPROXY_SYNCED_FOLDER": "nfs"})
    assert all(o == {"type": "nfs", "nfs_version": 4, "nfs_udp": False} for o in nfs.values())
    for kind in ("virtiofs", "virtualbox"):
        opts = folder_options({"IPVSPROXY_SYNCED_FOLDER": kind})
        assert all(o == {"type": kind} for o in opts.values()), opts
    # virtiofs needs the guest memory shared with virtiofsd; nothing else does.
    for kind, shared in (("virtiofs", True), ("rsync", False)):
        libvirt = calls(
            vm(vagrant_record(VAGRANTFILE, {"IPVSPROXY_SYNCED_FOLDER": kind})), "provider"
        )
        backing = [c for p in libvirt for c in calls(p["child"], "memorybacking")]
        assert bool(backing) == shared, kind


def test_unknown_synced_folder_stops_vagrant() -> None:
    proc = run(
        [tool(RUBY), "-e", RUBY_STUB, str(VAGRANTFILE)],
        env={**os.environ, "IPVSPROXY_SYNCED_FOLDER": "smb"},
    )
    assert proc.returncode != 0
    assert "IPVSPROXY_SYNCED_FOLDER" in proc.stderr


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
    assert overlay_module().IMAGE == IMAGE
    assert OVERLAY.read_text().count("default=IMAGE") == 2  # the ipvsproxy and target commands


def test_settings_check_reports_a_missing_one() -> None:
    env = machines(vagrant_record(VAGRANTFILE))["cp"]["provisioners"][0]["env"]
    del env["POD_CIDR"]
    assert missing_settings(env, "control-plane") == {"POD_CIDR"}


# --- references into the repository ------------------------------------------------------------

REFERENCE = re.compile(r"(?:(?<![\w.-])/vagrant|\$\{?REPO_DIR\}?|\$\{?PROVISION_DIR\}?)/([\w./-]+)")


def references(text: str) -> set[str]:
    """Repository paths a script uses, through /vagrant, $REPO_DIR or $PROVISION_DIR; the
    files the lab makes at run time (vagrant/.cluster, also named by the Vagrantfile's rsync
    patterns, which are anchored at the repository: /vagrant/.cluster/...) excluded."""
    found = set()
    for match in REFERENCE.finditer(text):
        path = match.group(1).rstrip(".")
        if match.group(0).startswith(("$PROVISION_DIR", "${PROVISION_DIR}")):
            path = f"vagrant/provision/{path}"
        if not path.startswith(("vagrant/.cluster", ".cluster/")) and path != "vagrant/.vagrant":
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


def kubeadm_join_problems(script: str) -> list[str]:
    """What is wrong with the script's `kubeadm join` calls (continuation lines joined): each
    must pin the cluster CA's public key and name the node."""
    joined = re.sub(r"\\\n\s*", " ", script)
    joins = [
        line
        for line in joined.splitlines()
        if re.match(r"\s*(?:(?:until|if|while)\s+)?kubeadm join\b", line)
    ]
    if not joins:
        return ["no kubeadm join"]
    problems = []
    for line in joins:
        if '--discovery-token-ca-cert-hash "sha256:$hash"' not in line:
            problems.append(f"CA not pinned: {line.strip()}")
        if "unsafe-skip-ca-verification" in line:
            problems.append(f"CA verification skipped: {line.strip()}")
        if '--node-name="$NODE_NAME"' not in line:
            problems.append(f"node name not given: {line.strip()}")
    return problems


def test_workers_join_pinning_the_cluster_ca() -> None:
    assert kubeadm_join_problems((PROVISION / "worker.sh").read_text()) == []


def test_join_check_reports_an_unpinned_join() -> None:
    text = (PROVISION / "worker.sh").read_text()
    pinned = '--discovery-token-ca-cert-hash "sha256:$hash"'
    assert pinned in text
    problems = kubeadm_join_problems(
        text.replace(pinned, "--discovery-token-unsafe-skip-ca-verification")
    )
    assert [p.split(":")[0] for p in problems] == ["CA not pinned", "CA verification skipped"]
    assert kubeadm_join_problems("kubeadm init") == ["no kubeadm join"]


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


# --- the cluster's token and CA, made on the host -----------------------------------------------

# RUBY_STUB without its report: the Vagrantfile loaded (its helpers defined), then a snippet.
RUBY_HELPERS = RUBY_STUB.replace("puts JSON.generate(Vagrant.configs)\n", "")


def vagrant_ruby(snippet: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run snippet with the Vagrantfile's helper methods defined; args are ARGV[1..]."""
    return run([tool(RUBY), "-e", RUBY_HELPERS + snippet, str(VAGRANTFILE), *args])


def make_secrets(cluster: Path, threads: int = 1) -> None:
    """lab_ensure_cluster_secrets from several threads at once, as libvirt's parallel
    `vagrant up` runs the trigger."""
    snippet = (
        f"{threads}.times.map {{ Thread.new {{ lab_ensure_cluster_secrets(ARGV[1]) }} }}"
        ".each(&:join)\n"
    )
    proc = vagrant_ruby(snippet, str(cluster))
    assert proc.returncode == 0, proc.stderr


def openssl(*args: str, stdin: str | None = None) -> str:
    proc = run([tool(OPENSSL), *args], input=stdin)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_cluster_secrets_are_made_once_as_one_set(tmp_path: Path) -> None:
    cluster = tmp_path / "vagrant" / ".cluster"
    make_secrets(cluster, threads=4)
    files = {p.name: p for p in cluster.iterdir() if p.name != ".lock"}
    assert set(files) == {"bootstrap-token", "ca.crt", "ca.key"}
    modes = {name: oct(path.stat().st_mode & 0o777) for name, path in files.items()}
    assert modes == {"bootstrap-token": "0o600", "ca.crt": "0o644", "ca.key": "0o600"}
    assert oct(cluster.stat().st_mode & 0o777) == "0o700"
    before = {name: path.read_bytes() for name, path in files.items()}
    make_secrets(cluster)
    assert {name: path.read_bytes() for name, path in files.items()} == before
    # A set missing a part is made anew, whole: a token never pairs with another cluster's CA.
    files["ca.key"].unlink()
    make_secrets(cluster)
    assert files["bootstrap-token"].read_bytes() != before["bootstrap-token"]
    assert files["ca.crt"].read_bytes() != before["ca.crt"]


def test_cluster_ca_is_a_ca_kubeadm_can_use(tmp_path: Path) -> None:
    cluster = tmp_path / "vagrant" / ".cluster"
    make_secrets(cluster)
    text = openssl("x509", "-noout", "-text", "-in", str(cluster / "ca.crt"))
    assert "Subject: CN = kubernetes" in text and "CA:TRUE" in text
    assert "Certificate Sign" in text and "DNS:kubernetes" in text
    # The key is the certificate's: kubeadm signs every other certificate with it.
    cert_pub = openssl("x509", "-pubkey", "-noout", "-in", str(cluster / "ca.crt"))
    key_pub = openssl("pkey", "-pubout", "-in", str(cluster / "ca.key"))
    assert cert_pub == key_pub
    openssl("verify", "-CAfile", str(cluster / "ca.crt"), str(cluster / "ca.crt"))


def test_workers_pin_the_hash_the_host_computes(tmp_path: Path) -> None:
    """The worker computes the CA public key's hash with openssl (provision/common.sh); the
    Vagrantfile's Ruby does it independently: they must agree, and differ for another CA."""
    hashes = []
    for name in ("one", "two"):
        cluster = tmp_path / name / "vagrant" / ".cluster"
        make_secrets(cluster)
        ruby = vagrant_ruby("puts lab_ca_cert_hash(File.read(ARGV[1]))", str(cluster / "ca.crt"))
        assert ruby.returncode == 0, ruby.stderr
        shell = common_sh('ca_cert_hash "$1"', str(cluster / "ca.crt"))
        assert shell.returncode == 0, shell.stderr
        assert re.fullmatch(r"[0-9a-f]{64}\n", shell.stdout)
        assert shell.stdout == ruby.stdout
        hashes.append(shell.stdout)
    assert hashes[0] != hashes[1]


def test_bootstrap_token_is_read_only_with_a_tokens_shape(tmp_path: Path) -> None:
    cluster = tmp_path / "vagrant" / ".cluster"
    make_secrets(cluster)
    read = 'REPO_DIR="$1"; . "' + str(PROVISION) + '/common.sh"; read_bootstrap_token'
    ok = run(["bash", "-c", read, "-", str(tmp_path)])
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == (cluster / "bootstrap-token").read_text()
    assert re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}\n", ok.stdout)
    (cluster / "bootstrap-token").write_text("abcdef.0123456789abcdef; reboot\n")
    bad = run(["bash", "-c", read, "-", str(tmp_path)])
    assert bad.returncode != 0 and "bootstrap token" in bad.stderr
    (cluster / "bootstrap-token").unlink()
    gone = run(["bash", "-c", read, "-", str(tmp_path)])
    assert gone.returncode != 0 and "vagrant rsync" in gone.stderr


FAKE_MACHINE = """
Comm = Struct.new(:files) do
  def test(command, opts = {})
    raise "not as root: #{command}" unless opts[:sudo]
    files.key?(command.split.last)
  end

  def sudo(command, opts = {})
    raise "unchecked: #{command}" unless opts[:error_check]
    yield :stderr, "noise"
    yield :stdout, files.fetch(command.split.last)
    0
  end
end
UI = Struct.new(:warnings) { def warn(text) = warnings << text }
Machine = Struct.new(:communicate, :ui, :name)
machine = Machine.new(Comm.new({"/etc/kubernetes/admin.conf" => "kind: Config\n"}), UI.new([]), :cp)
lab_export_cluster_access(machine, ARGV[1])
puts machine.ui.warnings
"""


def test_host_copies_the_admin_kubeconfig_out_of_cp(tmp_path: Path) -> None:
    """What the trigger after `cp` is up does, against a stand-in for the machine's SSH
    communicator: the file it has is copied (stdout only, mode 0600), the one it has not yet is
    reported and left alone."""
    cluster = tmp_path / ".cluster"
    proc = vagrant_ruby(FAKE_MACHINE, str(cluster))
    assert proc.returncode == 0, proc.stderr
    assert (cluster / "admin.conf").read_text() == "kind: Config\n"
    assert oct((cluster / "admin.conf").stat().st_mode & 0o777) == "0o600"
    assert not (cluster / "ipvsproxy.env").exists()
    assert "/var/lib/ipvsproxy-lab/ipvsproxy.env is not there yet" in proc.stdout


def test_triggers_make_secrets_before_up_and_copy_access_from_cp() -> None:
    config = vagrant_record(VAGRANTFILE)
    assert triggers(config) == [("before", ["up"])]
    found = machines(config)
    assert found["cp"]["triggers"] == [
        ("after", ["up", "provision", "reload"]),
        ("after", ["destroy"]),
    ]
    assert found["worker1"]["triggers"] == found["worker2"]["triggers"] == []


def test_proxy_target_names_deploys_daemonset() -> None:
    """Workers read where ipvsproxy runs from deploy/ itself; the names are those the control
    plane's overlay reports."""
    proc = overlay("target", "--base", str(REPO / "deploy"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "IPVSPROXY_NAMESPACE=kube-system",
        "IPVSPROXY_DAEMONSET=ipvsproxy",
        "IPVSPROXY_CONTAINER=ipvsproxy",
    ]
    wrong = overlay("target", "--base", str(REPO / "deploy"), "--image", "example.org/x:1")
    assert wrong.returncode == 1 and "example.org/x:1" in wrong.stderr


# --- vagrant validate ----------------------------------------------------------------------------

# What `vagrant validate` asks of the host beyond Vagrant, stood in for: VirtualBox's
# VBoxManage (the provider reports itself unusable without it; only `--version` is asked) and,
# for NFS, the host's NFS server (Linux: `systemctl` with systemd, `modinfo nfsd` without).
HOST_STUBS = {
    "VBoxManage": 'case "$1" in --version) echo 7.0.14r161095 ;; *) exit 1 ;; esac',
    "modinfo": 'test "$1" = nfsd',
    "systemctl": "echo nfs-server.service loaded active running",
}


def vagrant_validate(
    vagrantfile: Path, provider: str, tmp: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`vagrant validate` of the Vagrantfile in its directory with provider as the default
    provider; Vagrant's home and the machines' state in tmp, never in the repository."""
    stubs = tmp / "host-stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    for name, body in HOST_STUBS.items():
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("IPVSPROXY_", "VAGRANT_"))}
    environ.update(
        PATH=f"{stubs}:{environ.get('PATH', '/usr/bin:/bin')}",
        VAGRANT_HOME=str(tmp / "vagrant-home"),
        VAGRANT_DOTFILE_PATH=str(tmp / "vagrant-dotfile"),
        VAGRANT_CHECKPOINT_DISABLE="1",
        VAGRANT_DEFAULT_PROVIDER=provider,
    )
    environ.update(env or {})
    proc = run([tool(VAGRANT_CLI), "validate"], cwd=vagrantfile.parent, env=environ)
    boxes = tmp / "vagrant-home" / "boxes"
    assert not boxes.exists() or not any(boxes.iterdir()), "vagrant validate added a box"
    return proc


def validated(proc: subprocess.CompletedProcess[str]) -> bool:
    return proc.returncode == 0 and "Vagrantfile validated successfully" in proc.stdout


def broken_vagrantfile(tmp: Path, old: str, new: str) -> Path:
    """A copy of the Vagrantfile with old replaced, at tmp/vagrant/Vagrantfile (its synced
    folder, "..", is then tmp)."""
    text = VAGRANTFILE.read_text()
    assert old in text, old
    path = tmp / "vagrant" / "Vagrantfile"
    path.parent.mkdir(parents=True)
    path.write_text(text.replace(old, new))
    shutil.copy(REPO / "pyproject.toml", tmp)  # where the Vagrantfile reads the version
    return path


@pytest.mark.parametrize(
    ("provider", "synced_folder"),
    [
        ("libvirt", "rsync"),
        ("libvirt", "nfs"),
        ("virtualbox", "rsync"),
        ("virtualbox", "nfs"),
        ("virtualbox", "virtualbox"),
    ],
)
def test_vagrant_validate_accepts_the_vagrantfile(
    tmp_path: Path, provider: str, synced_folder: str
) -> None:
    """Each provider with each synced folder it can use. (virtiofs is left out: Vagrant's
    validation asks a running libvirtd for its version. Its settings are checked above.)"""
    cluster_before = (VAGRANT / ".cluster").exists()
    proc = vagrant_validate(
        VAGRANTFILE, provider, tmp_path, {"IPVSPROXY_SYNCED_FOLDER": synced_folder}
    )
    assert validated(proc), proc.stdout + proc.stderr
    # Validation runs no trigger and keeps its state in tmp: nothing is made in vagrant/.
    assert (VAGRANT / ".cluster").exists() == cluster_before
    assert not (VAGRANT / ".vagrant").exists()


def test_vagrant_validate_reports_a_ruby_syntax_error(tmp_path: Path) -> None:
    """(What `ruby -c` checked before the real validation ran here.)"""
    text = VAGRANTFILE.read_text()
    last_end = text.rstrip().rfind("end")
    broken = broken_vagrantfile(tmp_path, text, text[:last_end])  # Vagrant.configure unclosed
    proc = vagrant_validate(broken, "libvirt", tmp_path)
    assert not validated(proc)
    assert "syntax error" in proc.stderr


def test_vagrant_validate_default_needs_no_nfs_on_the_host(tmp_path: Path) -> None:
    """The defaults validate with no NFS server on the host (the stubs say there is none)."""
    no_nfs = {"PATH": f"{tmp_path / 'no-nfs'}:/usr/bin:/bin"}
    (tmp_path / "no-nfs").mkdir()
    for name, body in (("modinfo", "exit 1"), ("systemctl", "exit 1")):
        (tmp_path / "no-nfs" / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / "no-nfs" / name).chmod(0o755)
    assert validated(vagrant_validate(VAGRANTFILE, "libvirt", tmp_path / "a", no_nfs))
    nfs = vagrant_validate(
        VAGRANTFILE, "libvirt", tmp_path / "b", {**no_nfs, "IPVSPROXY_SYNCED_FOLDER": "nfs"}
    )
    assert not validated(nfs) and "NFS" in nfs.stderr


@pytest.mark.parametrize("provider", ["libvirt", "virtualbox"])
def test_vagrant_validate_reports_an_unknown_setting(tmp_path: Path, provider: str) -> None:
    broken = broken_vagrantfile(
        tmp_path,
        "machine.vm.hostname = node[:name]",
        "machine.vm.hostnme = node[:name]",
    )
    proc = vagrant_validate(broken, provider, tmp_path)
    assert not validated(proc)
    assert "hostnme" in proc.stderr


@pytest.mark.parametrize(
    ("provider", "old", "new"),
    [
        ("libvirt", "libvirt.cpus = node[:cpus]", "libvirt.cpu = node[:cpus]"),
        ("virtualbox", "vb.cpus = node[:cpus]", "vb.cpu = node[:cpus]"),
    ],
)
def test_vagrant_validate_reports_a_bad_provider_setting_for_that_provider(
    tmp_path: Path, provider: str, old: str, new: str
) -> None:
    """A provider's block is validated only when that provider is the one in use: the reason
    both are validated."""
    broken = broken_vagrantfile(tmp_path, old, new)
    proc = vagrant_validate(broken, provider, tmp_path / "a")
    assert not validated(proc)
    assert "cpu" in proc.stderr and "shouldn't exist" in proc.stderr
    other = "virtualbox" if provider == "libvirt" else "libvirt"
    assert validated(vagrant_validate(broken, other, tmp_path / "b"))


def test_vagrant_validate_reports_a_share_the_provider_cannot_use(tmp_path: Path) -> None:
    proc = vagrant_validate(
        VAGRANTFILE, "libvirt", tmp_path, {"IPVSPROXY_SYNCED_FOLDER": "virtualbox"}
    )
    assert not validated(proc)
    assert "synced folder type 'virtualbox'" in proc.stderr


def test_vagrant_validate_reports_a_bad_setting_of_ours(tmp_path: Path) -> None:
    proc = vagrant_validate(VAGRANTFILE, "libvirt", tmp_path, {"IPVSPROXY_SYNCED_FOLDER": "smb"})
    assert not validated(proc)
    assert "IPVSPROXY_SYNCED_FOLDER" in proc.stderr


def test_ci_installs_what_these_checks_run() -> None:
    """CI gets its Debian packages from lab/install-host-packages.sh (`make test`)."""
    script = (REPO / "lab" / "install-host-packages.sh").read_text()
    packages = {
        word
        for value in re.findall(r'^PKGS="([^"]*)"$', script, re.M)
        for word in value.split()
        if not word.startswith("$")
    }
    assert {"shellcheck", "ruby", "openssl", "rsync", "vagrant", "vagrant-libvirt"} <= packages
