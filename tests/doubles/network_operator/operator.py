"""TEST DOUBLE of the NVIDIA Network Operator, its SR-IOV operator and Multus, run against a real
lab cluster.

The real operators (and a ConnectX NIC) cannot exist here. This double does, through the lab's
real API server, what gpuboot depends on, from the objects gpuboot applied and each node's
double hardware (tests/doubles/hardware, the same tree preflight read):
- one DaemonSet per component the NicClusterPolicy turns on, with the image it names (the DOCA
  driver's tag from the node's OS and architecture, or kernel too when forcePrecompiled), on the
  nodes its node affinity selects, so the lab's nodes pull every image through the mirror;
- the RDMA shared device plugin's resources: rdmaHcaMax where its selectors (the plugin's own
  rules: vendors, deviceIDs, ifNames, linkTypes, all that are set) take a port, 0 otherwise;
- per SriovNetworkNodePolicy, numVfs x the PFs its nicSelector takes on each node it selects
  (more VFs than sriov_totalvfs fails that node's SriovNetworkNodeState, as the config daemon
  would), advertised under the operator's resource prefix;
- the operator's own lookup of the DOCA driver's tags (pkg/docadriverimages in v25.4.0): a real
  tag list from the registry the policy names, with the pull secrets it names and only the trust
  Go would have in the operator's container (SSL_CERT_DIR directories mounted from ConfigMaps;
  the lab mirror's CA is in no system store). A failed lookup knows no tag: a precompiled driver
  is then "not found" (forcePrecompiled: the policy is not ready, with the operator's message),
  else the build-on-node image is used; a found precompiled tag is used even when not forced;
- Node Feature Discovery's labels, which the real operator places the DOCA driver and the device
  plugins by (pkg/nodeinfo; the RDMA shared plugin's nodeSelector): nothing of either on a
  fabric node without them. Where an NFD worker pod of the chart (its double) is ready on a
  node, the double labels that node as NFD would from its hardware: the Mellanox PCI vendor
  (pci-15b3.present, the chart's NodeFeatureRule), the OS release and the kernel;
- nv-ipam's IPPool CRD, applied by the operator (not its chart) once the policy asks for nvIpam;
- NicClusterPolicy status.state ready once every component DaemonSet is ready;
- Multus' network-status on a pod that names a network gpuboot declared: an address from its
  IPPool, as Multus and nv-ipam would write it."""
from __future__ import annotations

import base64
import importlib.util
import ipaddress
import json
import re
import ssl
import urllib.request
from pathlib import Path

import yaml

from tests.doubles.controller import DoubleController

MODULE = Path(__file__).resolve().parents[3] / "roles" / "preflight" / "library" / "gpuboot_hardware_facts.py"
_spec = importlib.util.spec_from_file_location("gpuboot_hardware_facts_double", MODULE)
hw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hw)

NAMESPACE = "nvidia-network-operator"
# The real operator applies nv-ipam's CRDs itself, from its state-nv-ipam-cni manifests, once the
# NicClusterPolicy asks for nvIpam; its chart does not carry them (a real CRD's double).
NV_IPAM_CRD = Path(__file__).resolve().parent / "nv-ipam.nvidia.com_ippools.yaml"
OPERATOR = "network-operator"  # the chart's Deployment and container (named after the chart)
NETWORKS = (("sriovnetworks.sriovnetwork.openshift.io", True), ("sriovibnetworks.sriovnetwork.openshift.io", True),
            ("macvlannetworks.mellanox.com", False), ("ipoibnetworks.mellanox.com", False))
LINK = {"eth": "ether", "ib": "infiniband"}
NFD = "feature.node.kubernetes.io/"
# What the operator reads of a node before it places the DOCA driver there (pkg/nodeinfo).
NFD_LABELS = (f"{NFD}pci-15b3.present", f"{NFD}system-os_release.ID", f"{NFD}system-os_release.VERSION_ID",
              f"{NFD}kernel-version.full")


class DoubleNetworkOperator(DoubleController):
    name = "network-operator-double"

    def __init__(self, kubectl: Path, kubeconfig: Path, hardware: dict[str, dict], resource_prefix: str = "nvidia.com"
                 ) -> None:
        """`hardware`: node -> {sys_root: a double tree built from the node's facts, os_tag, kernel, arch}."""
        super().__init__(kubectl, kubeconfig)
        self.hardware, self.resource_prefix = hardware, resource_prefix
        self.ports = {node: hw.net_ports(str(facts["sys_root"])) for node, facts in hardware.items()}
        # The last tag lookup, for the test to read: {"repository", "tags" (None: failed), "error"}.
        self.lookup: dict = {}
        self._looked: tuple | None = None

    # -- the operator's DOCA tag lookup ------------------------------------------------
    def _trusted_pems(self) -> list[str]:
        """The certificates Go's x509 would add in the operator's container: every file of an
        SSL_CERT_DIR directory that a ConfigMap volume is mounted on."""
        deployment = self._get("deployment", OPERATOR, "-n", NAMESPACE)
        if deployment is None:
            return []
        pod = deployment["spec"]["template"]["spec"]
        container = next((c for c in pod["containers"] if c["name"] == OPERATOR), None)
        if container is None:
            return []
        dirs = next((e.get("value", "") for e in container.get("env") or [] if e["name"] == "SSL_CERT_DIR"), "")
        mounts = {m["mountPath"].rstrip("/"): m["name"] for m in container.get("volumeMounts") or []}
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        pems = []
        for directory in filter(None, dirs.split(":")):
            volume = volumes.get(mounts.get(directory.rstrip("/"), ""), {})
            if "configMap" in volume:
                config_map = self._get("configmap", volume["configMap"]["name"], "-n", NAMESPACE) or {}
                pems += [v for v in (config_map.get("data") or {}).values() if "BEGIN CERTIFICATE" in v]
        return pems

    def _auth(self, host: str, secret_names: list[str]) -> str | None:
        for name in secret_names:
            secret = self._get("secret", name, "-n", NAMESPACE)
            if secret is None:
                continue  # the operator skips a pull secret that does not exist
            config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
            if host in config.get("auths", {}):
                return config["auths"][host]["auth"]
        return None

    def doca_tags(self, driver: dict) -> list[str] | None:
        """The DOCA driver repository's tags as the operator lists them; None when it cannot."""
        host, _, path = driver["repository"].partition("/")
        repository = f"{path}/{driver['image']}" if path else driver["image"]
        pems = self._trusted_pems()
        secrets = list(driver.get("imagePullSecrets") or [])
        key = (driver["repository"], driver["image"], tuple(secrets), tuple(pems))
        if key == self._looked:
            return self.lookup.get("tags")
        context = ssl.create_default_context(cadata="\n".join(pems)) if pems else ssl.create_default_context()
        request = urllib.request.Request(f"https://{host}/v2/{repository}/tags/list")
        auth = self._auth(host, secrets)
        if auth:
            request.add_header("Authorization", f"Basic {auth}")
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as answer:
                tags, error = json.load(answer).get("tags") or [], None
        except (OSError, ValueError) as exc:  # TLS, auth, network: the operator logs and knows no tag
            tags, error = None, f"failed to list tags: {exc}"
        self.lookup = {"repository": f"{host}/{repository}", "tags": tags, "error": error}
        self._looked = key
        return tags

    def _items(self, *args: str) -> list[dict]:
        return (self._get(*args) or {"items": []})["items"]

    def _status(self, *target: str, body: dict) -> None:
        self._run("patch", *target, "--subresource=status", "--type=merge", "-p", json.dumps({"status": body}))

    # -- what the operators compute ------------------------------------------------
    @staticmethod
    def _shared_takes(port: dict, selectors: dict) -> bool:
        values = {"vendors": (port["vendor"] or "")[2:], "deviceIDs": (port["device_id"] or "")[2:],
                  "ifNames": port["ifname"], "linkTypes": LINK.get(port["link_type"] or "", ""), "drivers": None}
        return all(values.get(key) in wanted for key, wanted in selectors.items() if wanted)

    @staticmethod
    def _sriov_takes(port: dict, selector: dict) -> bool:
        checks = {"vendor": lambda v: (port["vendor"] or "")[2:] == v,
                  "deviceID": lambda v: (port["device_id"] or "")[2:] == v,
                  "pfNames": lambda v: port["ifname"] in v,
                  "rootDevices": lambda v: (port["pci_address"] or "").lower() in [a.lower() for a in v]}
        return all(checks[key](value) for key, value in selector.items() if value)

    def resources(self, node: str, labels: dict, policy: dict, sriov: list[dict]) -> tuple[dict[str, int], list[str]]:
        """What the device plugins advertise on the node, and the SR-IOV errors there."""
        found: dict[str, int] = {}
        errors: list[str] = []
        ports = self.ports[node]
        plugin = policy["spec"].get("rdmaSharedDevicePlugin")
        if plugin and self._selected(policy, labels):
            for entry in json.loads(plugin["config"])["configList"]:
                taken = [p for p in ports.values() if self._shared_takes(p, entry["selectors"])]
                found[f"{entry.get('resourcePrefix') or 'rdma'}/{entry['resourceName']}"] = \
                    entry["rdmaHcaMax"] if taken else 0
        for item in sriov:
            spec = item["spec"]
            if not all(labels.get(k) == v for k, v in spec["nodeSelector"].items()):
                continue
            taken = [p for p in ports.values() if self._sriov_takes(p, spec["nicSelector"])]
            total = 0
            for port in taken:
                limit = int((Path(self.hardware[node]["sys_root"]) / "bus" / "pci" / "devices" / port["pci_address"]
                             / "sriov_totalvfs").read_text())
                if spec["numVfs"] > limit:
                    errors.append(f"{port['ifname']}: numVfs {spec['numVfs']} above sriov_totalvfs {limit}")
                else:
                    total += spec["numVfs"]
            found[f"{self.resource_prefix}/{spec['resourceName']}"] = total
        return found, errors

    @staticmethod
    def _selected(policy: dict, labels: dict) -> bool:
        terms = policy["spec"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        return any(all(labels.get(e["key"]) in e["values"] for e in t["matchExpressions"]) for t in terms)

    def _daemonset(self, name: str, image: str, policy: dict, node: str | None = None,
                   node_selector: dict[str, str] | None = None) -> dict:
        terms = policy["spec"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        if node:  # the DOCA driver: one DaemonSet per image, on the nodes of that kernel/OS/arch
            terms = [{"matchExpressions": t["matchExpressions"] + [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]} for t in terms]
        return {"apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": name}},
                "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": terms}}}, **({"nodeSelector": node_selector} if node_selector else {}),
                        "containers": [{"name": name, "image": image}]}}}}

    def nfd_labels(self, node: str) -> dict[str, str]:
        """What NFD labels the node with: its OS release (ID, VERSION_ID from the os tag, e.g.
        debian12), its kernel, and, when a port of Mellanox's (vendor 0x15b3) is there, the
        chart's NodeFeatureRule label."""
        facts = self.hardware[node]
        found = re.fullmatch(r"([a-z]+)([0-9.]+)", facts["os_tag"])
        labels = {f"{NFD}system-os_release.ID": found.group(1), f"{NFD}system-os_release.VERSION_ID": found.group(2),
                  f"{NFD}kernel-version.full": facts["kernel"]}
        if any((p["vendor"] or "").lower() == "0x15b3" for p in self.ports[node].values()):
            labels[f"{NFD}pci-15b3.present"] = "true"
        return labels

    def discover(self, nodes: dict[str, dict]) -> None:
        """NFD's part, where the chart's NFD worker runs ready on a node."""
        workers = self._items("pods", "-n", NAMESPACE, "-l", "app=nfd-worker")
        running = {p["spec"].get("nodeName") for p in workers
                   if (p.get("status") or {}).get("containerStatuses")
                   and all(c.get("ready") for c in p["status"]["containerStatuses"])}
        for node in sorted(running & set(self.hardware) & set(nodes)):
            labels = nodes[node]["metadata"].get("labels") or {}
            wanted = self.nfd_labels(node)
            if any(labels.get(k) != v for k, v in wanted.items()):
                self._run("label", "node", node, "--overwrite", *(f"{k}={v}" for k, v in wanted.items()))
                labels.update(wanted)

    def reconcile(self) -> str | None:
        policy = self._get("nicclusterpolicies.mellanox.com", "nic-cluster-policy")
        if policy is None:
            return None
        spec = policy["spec"]
        if spec.get("nvIpam"):
            self._apply([yaml.safe_load(NV_IPAM_CRD.read_text())])
        nodes = {n["metadata"]["name"]: n for n in self._items("nodes")}
        self.discover(nodes)
        sriov = self._items("sriovnetworknodepolicies.sriovnetwork.openshift.io", "-n", NAMESPACE)
        objects = []
        for section, name in (("rdmaSharedDevicePlugin", "rdma-shared-dp-ds"), ("nvIpam", "nv-ipam-node")):
            if spec.get(section):
                body = spec[section]
                # The shared plugin's DaemonSet selects NFD's Mellanox label, as the real manifest does.
                selector = {NFD_LABELS[0]: "true"} if section == "rdmaSharedDevicePlugin" else None
                objects.append(self._daemonset(name, f"{body['repository']}/{body['image']}:{body['version']}", policy,
                                               node_selector=selector))
        for section, name in (("multus", "kube-multus-ds"), ("cniPlugins", "cni-plugins-ds"), ("ipoib", "kube-ipoib-cni-ds")):
            body = (spec.get("secondaryNetwork") or {}).get(section)
            if body:
                objects.append(self._daemonset(name, f"{body['repository']}/{body['image']}:{body['version']}", policy))
        # Without ofedDriver (the host's driver serves) the real operator runs no driver container.
        driver = spec.get("ofedDriver")
        known = (self.doca_tags(driver) or []) if driver else []
        missing = []
        unlabelled = []
        for node, facts in self.hardware.items():
            labels = (nodes.get(node) or {}).get("metadata", {}).get("labels", {})
            if node not in nodes or not self._selected(policy, labels):
                continue
            if labels.get(NFD_LABELS[0]) != "true" or not all(labels.get(k) for k in NFD_LABELS[1:]):
                # The real operator finds no node pool here: no driver, no plugin, and says nothing of the node.
                unlabelled.append(node)
                continue
            if driver:
                precompiled = f"{driver['version']}-{facts['kernel']}-{facts['os_tag']}-{facts['arch']}"
                if precompiled in known:
                    tag = precompiled
                elif driver.get("forcePrecompiled"):
                    missing.append(f"ForcePrecompiled is enabled and precompiled tag was not found: {precompiled}")
                    continue
                else:
                    tag = f"{driver['version']}-{facts['os_tag']}-{facts['arch']}"
                objects.append(self._daemonset(f"mofed-{node}", f"{driver['repository']}/{driver['image']}:{tag}",
                                               policy, node))
            resources, errors = self.resources(node, labels, policy, sriov)
            current = {k: v for k, v in (nodes[node].get("status", {}).get("capacity") or {}).items()
                       if k.startswith((self.resource_prefix + "/", "rdma/"))}
            wanted = {k: str(v) for k, v in resources.items()}
            if current != wanted:
                patch = {k: None for k in current if k not in wanted} | wanted
                self._status("node", node, body={"capacity": patch, "allocatable": patch})
            if sriov:
                self._apply([{"apiVersion": "sriovnetwork.openshift.io/v1", "kind": "SriovNetworkNodeState",
                              "metadata": {"name": node, "namespace": NAMESPACE}, "spec": {}}])
                self._status("sriovnetworknodestates.sriovnetwork.openshift.io", node, "-n", NAMESPACE, body={
                    "syncStatus": "Failed" if errors else "Succeeded", "lastSyncError": "; ".join(errors)})
        self._apply(objects)
        ready = all((ds.get("status") or {}).get("desiredNumberScheduled", 0) > 0
                    and ds["status"].get("numberReady", 0) == ds["status"]["desiredNumberScheduled"]
                    for ds in self._items("daemonsets", "-n", NAMESPACE)
                    if ds["metadata"]["name"] in {o["metadata"]["name"] for o in objects})
        ready = ready and not unlabelled
        state = "ready" if ready and not missing else "notReady"
        status = {"state": state, "appliedStates": [{"name": "state-OFED", "state": "ignore" if not driver else (
            "error" if missing else ("ready" if ready else "notReady")), "message": "; ".join(missing)}]}
        if {k: (policy.get("status") or {}).get(k) for k in status} != status:
            self._status("nicclusterpolicies.mellanox.com", "nic-cluster-policy", body=status)
        self.attach()
        return state

    def attach(self) -> None:
        """Multus' part: a pod naming a declared network gets an address from its pool."""
        networks = {}
        for kind, _ in NETWORKS:
            for net in self._items(kind, "-A"):
                ipam = json.loads(net["spec"].get("ipam") or "{}")
                networks[f"{net['spec'].get('networkNamespace', 'default')}/{net['metadata']['name']}"] = ipam.get("poolName")
        pools = {p["metadata"]["name"]: p["spec"] for p in self._items("ippools.nv-ipam.nvidia.com", "-n", NAMESPACE)}
        for pod in self._items("pods", "-A"):
            annotations = pod["metadata"].get("annotations") or {}
            wanted = annotations.get("k8s.v1.cni.cncf.io/networks")
            if not wanted or "k8s.v1.cni.cncf.io/network-status" in annotations or wanted not in networks:
                continue
            pool = pools.get(networks[wanted])
            if pool is None or not pod["spec"].get("nodeName"):
                continue
            address = str(next(ipaddress.ip_network(pool["subnet"]).hosts()) + 1)
            status = json.dumps([{"name": wanted, "interface": "net1", "ips": [address]}])
            self._run("annotate", "pod", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"],
                      f"k8s.v1.cni.cncf.io/network-status={status}")
