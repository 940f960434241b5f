package main

// The SR-IOV config daemon (sriov-network-config-daemon of Mellanox/sriov-network-operator, the
// fork the Network Operator's chart pins; pkg/daemon, cmd/sriov-network-config-daemon) for a node
// whose ConnectX ports are the double sysfs tree's:
//   - `start`: each pass of the real daemon's Reconcile over the node's SriovNetworkNodeState.
//     It waits for the operator's drain controller to annotate the state, reports the tree's
//     physical functions in status.interfaces, and on a new generation says InProgress, asks
//     for a drain (node and state annotated Drain_Required) where the generic plugin would (a
//     port that has VFs gets another count), makes the VFs once the operator says
//     DrainComplete (or at once where no drain is needed), annotates Idle again, restarts the
//     node's device plugin pod and says Succeeded; a count the port cannot have is Failed with
//     the reason, as the real one says when the NIC refuses it. In sync, it takes the
//     wait-for-config annotation off the node's device plugin pods.
//   - `wait-for-config`: the device plugin pod's init container (blockDevicePluginUntilConfigured):
//     annotates its own pod and holds until the daemon takes the annotation off.

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"gpuboot.local/doubles/kubeapi"
)

// The fork's constants (pkg/consts).
const (
	sriovAPI          = "/apis/sriovnetwork.openshift.io/v1"
	nodeDrainAnno     = "sriovnetwork.openshift.io/state"
	desiredStateAnno  = "sriovnetwork.openshift.io/desired-state"
	currentStateAnno  = "sriovnetwork.openshift.io/current-state"
	waitForConfigAnno = "sriovnetwork.openshift.io/device-plugin-wait-config"
	drainIdle         = "Idle"
	drainRequired     = "Drain_Required"
	draining          = "Draining"
	drainComplete     = "DrainComplete"
	syncSucceeded     = "Succeeded"
	syncFailed        = "Failed"
	syncInProgress    = "InProgress"
	devicePluginLabel = "app=sriov-device-plugin"
	// Where the daemon's pod sees the node's double tree: the host's / is mounted at /host.
	configDaemonHardwareRoot = "/host" + HardwareRoot
)

// SpecInterface: a port the operator's policies configure (api/v1 Interface, the fields the
// double acts on).
type SpecInterface struct {
	PciAddress        string `json:"pciAddress"`
	NumVfs            int    `json:"numVfs,omitempty"`
	Name              string `json:"name,omitempty"`
	LinkType          string `json:"linkType,omitempty"`
	ExternallyManaged bool   `json:"externallyManaged,omitempty"`
}

type NodeState struct {
	Metadata struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Generation  int64             `json:"generation"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	Spec struct {
		Interfaces []SpecInterface `json:"interfaces,omitempty"`
	} `json:"spec"`
	Status struct {
		SyncStatus    string `json:"syncStatus,omitempty"`
		LastSyncError string `json:"lastSyncError,omitempty"`
	} `json:"status"`
}

type configDaemon struct {
	k                        *kubeapi.Client
	node, namespace, sysRoot string
	applied                  int64 // the generation last applied; 0: none since the daemon started
}

func (d *configDaemon) statePath() string {
	return fmt.Sprintf("%s/namespaces/%s/sriovnetworknodestates/%s", sriovAPI, d.namespace, d.node)
}

// Step: one pass of the real daemon's Reconcile; it says what it did or waits for.
func (d *configDaemon) Step() (string, error) {
	var state NodeState
	status, err := d.k.Do("GET", d.statePath(), nil, &state)
	if err != nil {
		return "", err
	}
	if status == 404 {
		return "no SriovNetworkNodeState for the node yet", nil
	}
	annotations := state.Metadata.Annotations
	current, hasCurrent := annotations[currentStateAnno]
	if _, hasDesired := annotations[desiredStateAnno]; !hasDesired || !hasCurrent {
		return "waiting for the drain controller to annotate the node state", nil
	}
	host, err := PhysicalFunctions(d.sysRoot)
	if err != nil {
		return "", err
	}
	if state.Metadata.Generation == d.applied {
		if err := d.report(host, state.Status.SyncStatus, state.Status.LastSyncError); err != nil {
			return "", err
		}
		if len(state.Spec.Interfaces) > 0 {
			if err := d.unblockDevicePlugin(); err != nil {
				return "", err
			}
		}
		return "in sync", nil
	}
	if err := d.report(host, syncInProgress, state.Status.LastSyncError); err != nil {
		return "", err
	}
	if problem := refusal(state.Spec.Interfaces, host); problem != "" {
		return "failed: " + problem, d.report(host, syncFailed, problem)
	}
	needDrain := drainNeeded(state.Spec.Interfaces, host)
	if needDrain || current != drainIdle {
		switch current {
		case drainComplete:
		case draining:
			return "the operator is draining the node", nil
		default:
			return "asked the operator to drain the node", d.annotate(drainRequired)
		}
	}
	for _, port := range state.Spec.Interfaces {
		if port.ExternallyManaged {
			continue
		}
		if err := MakeVFs(d.sysRoot, port.PciAddress, port.NumVfs); err != nil {
			return "failed: " + err.Error(), d.report(host, syncFailed, err.Error())
		}
	}
	// Ports no policy configures any more lose the VFs the daemon made.
	for _, pf := range host {
		if pf.NumVfs > 0 && configured(state.Spec.Interfaces, pf.PciAddress) == nil {
			if err := MakeVFs(d.sysRoot, pf.PciAddress, 0); err != nil {
				return "", err
			}
		}
	}
	if err := d.restartDevicePlugin(); err != nil {
		return "", err
	}
	if err := d.annotate(drainIdle); err != nil {
		return "", err
	}
	if host, err = PhysicalFunctions(d.sysRoot); err != nil {
		return "", err
	}
	if err := d.report(host, syncSucceeded, ""); err != nil {
		return "", err
	}
	d.applied = state.Metadata.Generation
	return fmt.Sprintf("applied generation %d", d.applied), nil
}

// refusal: what the NIC would refuse of the spec (a port the node lacks, more VFs than it has).
func refusal(spec []SpecInterface, host []InterfaceExt) string {
	for _, port := range spec {
		pf := find(host, port.PciAddress)
		switch {
		case pf == nil:
			return fmt.Sprintf("double: no physical function %s on the node", port.PciAddress)
		case port.NumVfs > pf.TotalVfs:
			return fmt.Sprintf("double: %s (%s) sriov_totalvfs is %d, %d VFs asked", pf.Name, pf.PciAddress, pf.TotalVfs,
				port.NumVfs)
		}
	}
	return ""
}

// drainNeeded: the generic plugin's needToUpdateVFs: a port that has VFs gets another count, or
// loses its policy.
func drainNeeded(spec []SpecInterface, host []InterfaceExt) bool {
	for _, pf := range host {
		if pf.NumVfs == 0 {
			continue
		}
		port := configured(spec, pf.PciAddress)
		if port == nil || (!port.ExternallyManaged && port.NumVfs != pf.NumVfs) {
			return true
		}
	}
	return false
}

func configured(spec []SpecInterface, address string) *SpecInterface {
	for i := range spec {
		if spec[i].PciAddress == address {
			return &spec[i]
		}
	}
	return nil
}

func find(host []InterfaceExt, address string) *InterfaceExt {
	for i := range host {
		if host[i].PciAddress == address {
			return &host[i]
		}
	}
	return nil
}

func (d *configDaemon) report(host []InterfaceExt, sync, lastError string) error {
	return d.k.MergePatch(d.statePath()+"/status", map[string]any{"status": map[string]any{
		"interfaces": host, "syncStatus": sync, "lastSyncError": lastError}})
}

// annotate: the node and its state, as the real daemon's annotate does.
func (d *configDaemon) annotate(value string) error {
	if err := d.k.MergePatch("/api/v1/nodes/"+d.node, map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{nodeDrainAnno: value}}}); err != nil {
		return err
	}
	return d.k.MergePatch(d.statePath(), map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{desiredStateAnno: value}}})
}

type podList struct {
	Items []struct {
		Metadata struct {
			Name        string            `json:"name"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"metadata"`
	} `json:"items"`
}

func (d *configDaemon) devicePluginPods() (podList, error) {
	query := url.Values{"labelSelector": {devicePluginLabel}, "fieldSelector": {"spec.nodeName=" + d.node}}
	var pods podList
	_, err := d.k.Do("GET", fmt.Sprintf("/api/v1/namespaces/%s/pods?%s", d.namespace, query.Encode()), nil, &pods)
	return pods, err
}

// restartDevicePlugin: the node's device plugin pod is deleted so that its DaemonSet starts
// one that reads the new VFs.
func (d *configDaemon) restartDevicePlugin() error {
	pods, err := d.devicePluginPods()
	if err != nil {
		return err
	}
	for _, pod := range pods.Items {
		path := fmt.Sprintf("/api/v1/namespaces/%s/pods/%s", d.namespace, pod.Metadata.Name)
		if _, err := d.k.Do("DELETE", path, nil, nil); err != nil {
			return err
		}
	}
	return nil
}

func (d *configDaemon) unblockDevicePlugin() error {
	pods, err := d.devicePluginPods()
	if err != nil {
		return err
	}
	for _, pod := range pods.Items {
		if _, waiting := pod.Metadata.Annotations[waitForConfigAnno]; !waiting {
			continue
		}
		path := fmt.Sprintf("/api/v1/namespaces/%s/pods/%s", d.namespace, pod.Metadata.Name)
		if err := d.k.MergePatch(path, map[string]any{"metadata": map[string]any{
			"annotations": map[string]any{waitForConfigAnno: nil}}}); err != nil {
			return err
		}
	}
	return nil
}

// waitForConfig: annotate the pod, then hold until the annotation is gone.
func waitForConfig(ctx context.Context, k *kubeapi.Client, namespace, pod string, every time.Duration) error {
	path := fmt.Sprintf("/api/v1/namespaces/%s/pods/%s", namespace, pod)
	if err := k.MergePatch(path, map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{waitForConfigAnno: "true"}}}); err != nil {
		return err
	}
	for {
		var got struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if _, err := k.Do("GET", path, nil, &got); err != nil {
			return err
		}
		if _, waiting := got.Metadata.Annotations[waitForConfigAnno]; !waiting {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}

func configDaemonMain(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "sriov-network-config-daemon TEST DOUBLE: start or wait-for-config")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	k, err := kubeapi.InCluster()
	if err != nil {
		log.Print(err)
		return 1
	}
	switch args[0] {
	case "wait-for-config":
		flags := flag.NewFlagSet("wait-for-config", flag.ContinueOnError)
		pod := flags.String("pod-name", "", "")
		namespace := flags.String("pod-namespace", "", "")
		if err := flags.Parse(args[1:]); err != nil || *pod == "" || *namespace == "" {
			log.Print("wait-for-config needs --pod-name and --pod-namespace")
			return 2
		}
		if err := waitForConfig(ctx, k, *namespace, *pod, 2*time.Second); err != nil {
			log.Print(err)
			return 1
		}
		log.Print("the config daemon took the annotation off: the device plugin may start")
		return 0
	case "start":
		d := &configDaemon{k: k, node: os.Getenv("NODE_NAME"), namespace: os.Getenv("NAMESPACE"),
			sysRoot: configDaemonHardwareRoot}
		if d.node == "" || d.namespace == "" {
			log.Print("NODE_NAME and NAMESPACE must be set (the DaemonSet sets them)")
			return 2
		}
		last := ""
		for {
			said, err := d.Step()
			if err != nil {
				said = "error: " + err.Error()
			}
			if said != last {
				log.Print(said)
				last = said
			}
			select {
			case <-ctx.Done():
				return 0
			case <-time.After(5 * time.Second):
			}
		}
	default:
		fmt.Fprintf(os.Stderr, "sriov-network-config-daemon TEST DOUBLE: no command %q\n", args[0])
		return 2
	}
}
