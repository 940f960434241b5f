"""`gpuboot gitops render`: the Git repository Argo CD takes the cluster over from.

Under gpuboot.gitops.path (one directory per cluster):

    argocd/                      what the root Application syncs: the AppProjects and Applications
      root.yaml                  the root Application itself (app of apps; it manages itself)
      projects/                  platform, and one AppProject per tenant
      applications/              one Application per add-on, per tenant, and the priority tiers
    addons/<addon>/values.yaml   the chart's values, exactly what `gpuboot up` rendered it with
    addons/<addon>/base/         the objects gpuboot applied beside the chart
    addons/<addon>/overlays/<cluster>/   the cluster's patches (none at handoff)
    tenants/priority-classes/    the tiers tenants name
    tenants/queues/              with gpuboot.kai_scheduler: a KAI queue per tenant, and the
                                 admission rule that keeps each tenant in its own
    tenants/<tenant>/            one bundle per tenant

The add-ons' files come from the same role templates and inputs as `gpuboot up` (the render
engine), and each chart is rendered by Argo CD with the same values, release name and
namespace as gpuboot's `helm template`, so adoption finds nothing to change. Kept out of Git:
the mirror's login (a Secret; the handoff phase gives Argo CD its own copy), Node labels
(Nodes belong to the kubelet; gpuboot keeps labelling its nodes) and the Network Operator's
trust of the mirror's CA (fields added to the chart's own Deployment under their own field
manager: in Git beside the chart it would be a second, partial copy of that Deployment)."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuboot import content
from gpuboot.config.model import Cluster, GitOps
from gpuboot.errors import UsageError
from gpuboot.gitops import queues as kai_queues
from gpuboot.gitops import tenants as tenancy
from gpuboot.gitops import vclusters
from gpuboot.phases import catalog
from gpuboot.phases.render import phase_files

ARGOCD_NAMESPACE = "argocd"
IN_CLUSTER = "https://kubernetes.default.svc"
PLATFORM_PROJECT = "platform"
CHART_RELEASE_LABEL = "gpuboot.io/chart-release"
# Files of an add-on's directory that stay with gpuboot (see the module's docstring).
# values.yaml is the chart's input; the others are applied by gpuboot even after the handoff
# (playbooks/tasks/install_chart.yml reads the same list).
KEPT_BY_GPUBOOT = frozenset({"values.yaml", *yaml.safe_load(
    (content.content_dir() / "playbooks" / "group_vars" / "all" / "charts.yml").read_text())[
    "chart_install_kept_by_gpuboot"]})
# A tenant's own Applications may not touch what bounds it.
TENANT_GUARDRAILS = (("", "ResourceQuota"), ("", "LimitRange"), ("networking.k8s.io", "NetworkPolicy"),
                     ("rbac.authorization.k8s.io", "RoleBinding"), ("rbac.authorization.k8s.io", "Role"))


@dataclass(frozen=True)
class Addon:
    """An add-on `gpuboot up` installs with playbooks/tasks/install_chart.yml and Argo CD takes
    over: every fact of it is the phase's (its catalog entry, role and playbook)."""

    name: str      # its directory in the repository and its Application's suffix
    phase: str     # the phase of `up` that installs it
    role: str      # the role whose files it is
    release: str   # chart_install_release in the phase's playbook
    chart: str     # the release matrix's key

    @classmethod
    def of(cls, phase: catalog.Phase) -> Addon:
        if phase.addon is None or phase.release is None:
            raise ValueError(f"phase {phase.name} installs no add-on")
        return cls(name=Path(catalog.addon_directory(phase.addon)).name, phase=phase.name, role=phase.addon,
                   release=phase.release, chart=phase.addon)


# In the order `up` installs them.
ADDONS = tuple(Addon.of(phase) for phase in catalog.UP if phase.addon)
# Installed by Argo CD alone (gpuboot.kai_scheduler): no phase of `up` installs it.
KAI_SCHEDULER = "kai-scheduler"
# An Application whose objects' kinds come from another Application's CRDs: Argo CD's dry run
# would fail until they exist, so it skips it for those, and the sync retries until they do.
WAITS_FOR_CRDS = {"syncOptions": ["SkipDryRunOnMissingResource=true"],
                  "retry": {"limit": -1, "backoff": {"duration": "10s", "factor": 2, "maxDuration": "3m"}}}
# API groups whose CRDs an operator applies itself once it reconciles its policy, not with its
# chart: an add-on holding such objects waits for them the same way (the Network Operator's
# nv-ipam IPPool, from its state-nv-ipam-cni).
OPERATOR_MADE_GROUPS = ("nv-ipam.nvidia.com/",)


def dump(objects: list[dict]) -> str:
    return "---\n".join(yaml.safe_dump(o, sort_keys=False, default_flow_style=False) for o in objects)


class Repository:
    """The files of the repository, by path relative to its root."""

    def __init__(self, cluster: Cluster) -> None:
        if cluster.settings.gitops is None:
            raise UsageError("gpuboot.gitops is not set: there is no repository to render for",
                             hint="set gpuboot.gitops.repo_url (and branch, path) in the inventory")
        self.cluster = cluster
        self.gitops: GitOps = cluster.settings.gitops
        self.root = Path(self.gitops.directory(cluster.settings.cluster_name))
        self.extravars = cluster.extravars()
        self.files: dict[Path, str] = {}
        self.applications: list[dict] = []

    # -- layout -------------------------------------------------------------------------
    def add(self, relative: str | Path, text: str) -> None:
        self.files[self.root / relative] = text

    def add_kustomization(self, directory: str | Path, resources: list[str]) -> None:
        self.add(Path(directory) / "kustomization.yaml", yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": resources}, sort_keys=False))

    def render(self) -> dict[Path, str]:
        for addon in ADDONS:
            self.addon(addon)
        self.kai_scheduler()
        self.tenants()
        self.argocd()
        return dict(sorted(self.files.items()))

    # -- add-ons --------------------------------------------------------------------------
    def addon(self, addon: Addon) -> None:
        files = {Path(rendered.dest).name: rendered.text
                 for role, rendered in phase_files(self.cluster, addon.phase) if role == addon.role}
        if "values.yaml" not in files:
            return  # not installed on this cluster
        base = Path("addons") / addon.name / "base"
        objects = sorted(name for name in files if name not in KEPT_BY_GPUBOOT)
        for name in objects:
            self.add(base / name, self.without_tenant_namespaces(files[name]))
        self.add_kustomization(base, objects)
        self.add_kustomization(Path("addons") / addon.name / "overlays" / self.cluster.settings.cluster_name,
                               ["../../base"])
        self.add(Path("addons") / addon.name / "values.yaml", files["values.yaml"])
        namespace = next(doc["metadata"]["name"] for doc in yaml.safe_load_all(files["namespace.yaml"])
                         if doc and doc.get("kind") == "Namespace")
        waits = any(str(doc.get("apiVersion", "")).startswith(OPERATOR_MADE_GROUPS)
                    for name in objects for doc in yaml.safe_load_all(files[name]) if isinstance(doc, dict))
        self.applications.append(self.addon_application(addon.name, addon.chart, namespace, release=addon.release,
                                                         adopted=True, waits_for_crds=waits))

    def without_tenant_namespaces(self, text: str) -> str:
        """An add-on's objects less the Namespaces of tenants: every object in the repository has
        one owner, and a tenant's namespace is its bundle's (tenants/<name>), even where `up`
        made it first for an add-on (the networks pods of that tenant attach to)."""
        tenants = {tenant.name for tenant in self.cluster.settings.tenants}
        docs = [doc for doc in yaml.safe_load_all(text) if doc]
        kept = [doc for doc in docs if not (doc.get("kind") == "Namespace" and doc["metadata"]["name"] in tenants)]
        if len(kept) == len(docs):
            return text
        given = sorted({doc["metadata"]["name"] for doc in docs} - {doc["metadata"]["name"] for doc in kept})
        return (f"# Namespace {', '.join(given)}: the tenant bundle's (tenants/), not this add-on's.\n"
                + (dump(kept) if kept else ""))

    def kai_scheduler(self) -> None:
        """KAI, when the inventory turns it on: its chart from the mirror with gpuboot's values, and
        its namespace. No phase of `up` installs it, so this Application is its only installer."""
        if not self.cluster.settings.kai_scheduler.enabled:
            return
        directory = Path("addons") / KAI_SCHEDULER
        namespace = {"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": KAI_SCHEDULER, "labels": {"app.kubernetes.io/managed-by": "gpuboot"}}}
        self.add(directory / "base" / "namespace.yaml", dump([namespace]))
        self.add_kustomization(directory / "base", ["namespace.yaml"])
        self.add_kustomization(directory / "overlays" / self.cluster.settings.cluster_name, ["../../base"])
        values = kai_queues.kai_values(self.extravars["gpuboot_release"]["kai_scheduler"])
        self.add(directory / "values.yaml", yaml.safe_dump(values, sort_keys=False))
        self.applications.append(self.addon_application(KAI_SCHEDULER, "kai_scheduler", KAI_SCHEDULER,
                                                        release=KAI_SCHEDULER, adopted=False))

    def chart_source(self, chart_key: str, field: str = "chart") -> dict:
        chart = self.extravars["gpuboot_release"][chart_key][field]
        registry = self.cluster.settings.mirror.registry
        # From the mirror: OCI charts/<name>:<version>, the repository `gpuboot mirror push` fills.
        # Argo CD names a Helm OCI repository without its scheme (a repository Secret with
        # enableOCI says how to reach it: the handoff's for the mirror, public_oci_repositories else).
        repo = f"{registry}/charts" if registry else chart["repository"].removeprefix("oci://")
        return {"repoURL": repo, "chart": chart["name"], "targetRevision": str(chart["version"])}

    def chart_sources(self, chart_key: str, release: str, values: Path) -> list[dict]:
        """A chart from the mirror and its values file in this repository (Argo CD's `$values` ref),
        after the chart of its CRDs where the matrix names one (crd_chart: the same objects
        playbooks/tasks/install_chart.yml applies first)."""
        crds = []
        if self.extravars["gpuboot_release"][chart_key].get("crd_chart"):
            crds = [self.chart_source(chart_key, "crd_chart") | {"helm": {"releaseName": f"{release}-crds"}}]
        source = self.chart_source(chart_key)
        source["helm"] = {"releaseName": release, "valueFiles": [f"$values/{values}"]}
        return [*crds, source, {"repoURL": self.gitops.repo_url, "targetRevision": self.gitops.branch, "ref": "values"}]

    def public_oci_repositories(self) -> list[dict]:
        """Without a mirror, each upstream OCI chart repository an Application names, declared to
        Argo CD as OCI. They hold no credential (public registries), so they can live in Git."""
        if self.cluster.settings.mirror.registry:
            return []
        # A chart source names an OCI repository without its scheme (chart_source).
        oci = sorted({source["repoURL"] for app in self.applications for source in app["spec"].get("sources", [])
                      if "chart" in source and "://" not in source["repoURL"]})
        return [{"apiVersion": "v1", "kind": "Secret",
                 "metadata": {"name": "chart-repository-" + url.replace("/", "-").replace(".", "-"),
                              "namespace": ARGOCD_NAMESPACE,
                              "labels": {"argocd.argoproj.io/secret-type": "repository"}},
                 "type": "Opaque", "stringData": {"type": "helm", "url": url, "enableOCI": "true"}}
                for url in oci]

    def addon_application(self, name: str, chart_key: str, namespace: str, *, release: str, adopted: bool,
                          waits_for_crds: bool = False) -> dict:
        """An add-on's chart, rendered by Argo CD from the mirror with the values in Git. `adopted`:
        `up` installed it on day 1 (the label tells a later `up` that Argo CD owns it now)."""
        directory = self.root / "addons" / name
        overlay = {"repoURL": self.gitops.repo_url, "targetRevision": self.gitops.branch,
                   "path": str(directory / "overlays" / self.cluster.settings.cluster_name)}
        # An object a newer chart drops is left, as `gpuboot up` leaves it: removing an
        # operator's object is a person's decision.
        return self.application(f"addon-{name}", PLATFORM_PROJECT, namespace, release=release if adopted else None,
                                sources=[*self.chart_sources(chart_key, release, directory / "values.yaml"), overlay],
                                prune=False, waits_for_crds=waits_for_crds)

    # -- tenants ------------------------------------------------------------------------
    def tenants(self) -> None:
        settings = self.cluster.settings
        if not settings.tenants:
            return
        gpu = self.extravars["gpuboot_gpu"]
        offered = {name for node in gpu["nodes"].values() for name in (node.get("resources") or {})}
        mig_profiles = sorted(name.removeprefix(tenancy.MIG_PREFIX) for name in offered
                              if name.startswith(tenancy.MIG_PREFIX))
        time_sliced = any(node.settings.gpu and node.settings.gpu.time_slicing_replicas
                          for node in self.cluster.nodes)
        minor = "v" + ".".join(self.extravars["gpuboot_release"]["kubernetes"]["version"].lstrip("v").split(".")[:2])
        tiers = Path("tenants") / "priority-classes"
        self.add(tiers / "priority-classes.yaml", dump(tenancy.priority_classes(settings.tenants)))
        self.add_kustomization(tiers, ["priority-classes.yaml"])
        self.applications.append(self.application("tenants-priority-classes", PLATFORM_PROJECT, None,
                                                  path=str(self.root / tiers)))
        if any(tenant.node_group for tenant in settings.tenants):
            groups = Path("tenants") / "node-groups"
            self.add(groups / "admission.yaml", dump(tenancy.node_group_admission()))
            self.add_kustomization(groups, ["admission.yaml"])
            self.applications.append(self.application("tenants-node-groups", PLATFORM_PROJECT, None,
                                                      path=str(self.root / groups)))
        kai = settings.kai_scheduler
        if kai.enabled:
            queues = Path("tenants") / "queues"
            self.add(queues / "queues.yaml", dump(kai_queues.queues(kai, settings.tenants)))
            self.add(queues / "admission.yaml", dump(kai_queues.queue_admission()))
            self.add_kustomization(queues, ["admission.yaml", "queues.yaml"])
            # The Queue kind comes with KAI's chart (addon-kai-scheduler).
            self.applications.append(self.application("tenants-queues", PLATFORM_PROJECT, None,
                                                      path=str(self.root / queues), waits_for_crds=True))
        for tenant in settings.tenants:
            directory = Path("tenants") / tenant.name
            files = tenancy.bundle(tenant, kubernetes_minor=minor, mig_profiles=mig_profiles, time_sliced=time_sliced)
            if tenant.vcluster.enabled:
                files["network-policies.yaml"].append(tenancy.network_policy(
                    tenant, "allow-vcluster-to-api-server",
                    vclusters.api_server_access([node.address for node in self.cluster.control_planes],
                                                settings.control_plane.apiserver_port)))
            for name, objects in files.items():
                self.add(directory / name, dump(objects))
            self.add_kustomization(directory, sorted(files))
            self.applications.append(self.application(f"tenant-{tenant.name}", PLATFORM_PROJECT, tenant.name,
                                                      path=str(self.root / directory)))
            if tenant.vcluster.enabled:
                self.vcluster(tenant, directory)

    def vcluster(self, tenant, directory: Path) -> None:
        """The tenant's vCluster: the chart in its namespace, in the platform project (the chart
        makes the Role and RoleBinding a tenant's own project may not)."""
        images = self.extravars["gpuboot_release"]["images"]["vcluster"]
        self.add(directory / "vcluster" / "values.yaml",
                 yaml.safe_dump(vclusters.values(tenant, images), sort_keys=False))
        sources = self.chart_sources("vcluster", vclusters.RELEASE, self.root / directory / "vcluster" / "values.yaml")
        # Its state is on a volume: a chart change that drops an object is a person's decision.
        self.applications.append(self.application(f"tenant-{tenant.name}-vcluster", PLATFORM_PROJECT, tenant.name,
                                                  sources=sources, prune=False))

    # -- Argo CD ------------------------------------------------------------------------
    def application(self, name: str, project: str, namespace: str | None, *, path: str | None = None,
                    sources: list[dict] | None = None, prune: bool = True, release: str | None = None,
                    waits_for_crds: bool = False) -> dict:
        spec: dict = {"project": project}
        if sources is not None:
            spec["sources"] = sources
        else:
            spec["source"] = {"repoURL": self.gitops.repo_url, "targetRevision": self.gitops.branch, "path": path}
        destination = {"server": IN_CLUSTER}
        if namespace:
            destination["namespace"] = namespace
        spec["destination"] = destination
        # Server-side apply: the field manager of day 1 was server-side too, and the operators'
        # CRDs are too large for a client-side apply's annotation.
        spec["syncPolicy"] = {"automated": {"prune": prune, "selfHeal": True},
                              "syncOptions": ["ServerSideApply=true", "CreateNamespace=false"]}
        if waits_for_crds:
            spec["syncPolicy"]["syncOptions"] += WAITS_FOR_CRDS["syncOptions"]
            spec["syncPolicy"]["retry"] = WAITS_FOR_CRDS["retry"]
        labels = {"app.kubernetes.io/part-of": self.cluster.settings.cluster_name}
        if release:
            # How `gpuboot up` finds that Argo CD owns a chart it used to install.
            labels[CHART_RELEASE_LABEL] = release
        return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": {"name": name, "namespace": ARGOCD_NAMESPACE, "labels": labels},
                "spec": spec}

    def platform_project(self) -> dict:
        repos = [self.gitops.repo_url] + sorted({a["spec"]["sources"][0]["repoURL"]
                                                 for a in self.applications if "sources" in a["spec"]})
        return {"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": PLATFORM_PROJECT, "namespace": ARGOCD_NAMESPACE},
                "spec": {"description": "The cluster's add-ons and the tenants' bounds, owned by the platform team",
                         "sourceRepos": repos,
                         "destinations": [{"server": IN_CLUSTER, "namespace": "*"}],
                         "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]}}

    def tenant_project(self, tenant) -> dict:
        """Where a tenant's own Applications may deploy: its namespace, from the cluster's
        repository, never a cluster-scoped object and never its own bounds."""
        name = f"tenant-{tenant.name}"
        groups = sorted(set(tenant.groups) | set(tenant.admin_groups))
        spec = {"description": f"Tenant {tenant.name}: its namespace only",
                "sourceRepos": [self.gitops.repo_url],
                "destinations": [{"server": IN_CLUSTER, "namespace": tenant.name}],
                "clusterResourceWhitelist": [],
                "namespaceResourceBlacklist": [{"group": g, "kind": k} for g, k in TENANT_GUARDRAILS]}
        if groups:
            spec["roles"] = [{"name": "developers", "description": f"{tenant.name}'s groups",
                              "groups": groups,
                              "policies": [f"p, proj:{name}:developers, applications, *, {name}/*, allow"]}]
        return {"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": name, "namespace": ARGOCD_NAMESPACE}, "spec": spec}

    def argocd(self) -> None:
        argocd = Path("argocd")
        root = self.application(f"{self.cluster.settings.cluster_name}-root", PLATFORM_PROJECT, ARGOCD_NAMESPACE,
                                path=str(self.root / argocd))
        self.add(argocd / "root.yaml", dump([root]))
        resources = ["root.yaml"]
        projects = [self.platform_project()] + [self.tenant_project(t) for t in self.cluster.settings.tenants]
        for project in projects:
            relative = Path("projects") / f"{project['metadata']['name']}.yaml"
            self.add(argocd / relative, dump([project]))
            resources.append(str(relative))
        for app in self.applications:
            relative = Path("applications") / f"{app['metadata']['name']}.yaml"
            self.add(argocd / relative, dump([app]))
            resources.append(str(relative))
        for secret in self.public_oci_repositories():
            relative = Path("repositories") / f"{secret['metadata']['name']}.yaml"
            self.add(argocd / relative, dump([secret]))
            resources.append(str(relative))
        self.add_kustomization(argocd, resources)


MARKER = ".gpuboot-gitops.json"


def write(cluster: Cluster, out: Path) -> list[Path]:
    """Write the repository under OUT (its root). The cluster's directory is replaced whole, so
    a file the inventory no longer makes does not linger; it must be one gpuboot wrote for this
    cluster (its marker file says so) or not exist, never someone else's directory."""
    repository = Repository(cluster)
    files = repository.render()
    name = cluster.settings.cluster_name
    target = out / repository.root
    marker = target / MARKER
    if target.exists() and any(target.iterdir()):
        owner = json.loads(marker.read_text()).get("cluster") if marker.is_file() else None
        if owner != name:
            whose = f"cluster {owner}'s" if owner else "files gpuboot did not write"
            raise UsageError(f"{target} holds {whose}: gpuboot replaces the cluster's directory whole and will "
                             "not remove them",
                             hint="set gpuboot.gitops.path to a directory of this cluster's own, or empty that one")
        shutil.rmtree(target)
    files[repository.root / MARKER] = json.dumps({"cluster": name, "written_by": "gpuboot gitops render"}) + "\n"
    for relative, text in files.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return [out / relative for relative in sorted(files)]
