package main

// The MIG manager double (nvcr.io/nvidia/cloud-native/k8s-mig-manager's nvidia-mig-manager):
// the real one (NVIDIA/mig-parted v0.15.0, cmd/nvidia-mig-manager and pkg/mig/reconfigure)
// drives NVML through nvidia-mig-parted and nvidia-ctk, which need a GPU; this double keeps its
// contract with the cluster and writes the layout into the node's double GPUs instead.
//
// It runs as the operator's DaemonSet runs it (the entrypoint ConfigMap sources the validator's
// driver-ready file, then execs nvidia-mig-manager), with the env the operator gives it:
// NODE_NAME, CONFIG_FILE (a custom config) or DEFAULT_CONFIG_FILE, GPU_CLIENTS_FILE,
// DEFAULT_GPU_CLIENTS_NAMESPACE. Whenever the node's nvidia.com/mig.config label changes (and
// once at start), it reconfigures as reconfigure.Run does:
//   - the config must be in the file and fit the GPUs, else nvidia.com/mig.config.state=failed;
//   - already applied: state success;
//   - else state pending; the deploy labels of the device plugin, GFD, the DCGM exporter, DCGM
//     and NVSM (and gpu.deploy.client when set) go to paused-for-mig-change unless "false";
//     it waits until their pods (app=... in the operator's namespace) have left the node and
//     deletes the CUDA and plugin validator pods; applies the layout; deletes the operator
//     validator's pod, so that every validation runs again; sets the deploy labels back to true
//     (those that were not "false"); state success.
// A failure sets state failed and puts the deploy labels back, as setState does.

import (
	"fmt"
	"gpuboot.local/doubles/kubeapi"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"
)

const (
	migConfigLabel = "nvidia.com/mig.config"
	migStateLabel  = "nvidia.com/mig.config.state"
	gpuClientLabel = "nvidia.com/gpu.deploy.client"
	migPaused      = "paused-for-mig-change"
	migPodsTimeout = 5 * time.Minute
)

// The GPU clients the MIG manager stops around a change: deploy label, and its pods' app label.
var migGPUClients = []struct{ label, app string }{
	{"nvidia.com/gpu.deploy.device-plugin", "nvidia-device-plugin-daemonset"},
	{"nvidia.com/gpu.deploy.gpu-feature-discovery", "gpu-feature-discovery"},
	{"nvidia.com/gpu.deploy.dcgm-exporter", "nvidia-dcgm-exporter"},
	{"nvidia.com/gpu.deploy.dcgm", "nvidia-dcgm"},
	{"nvidia.com/gpu.deploy.nvsm", ""},
}

type migSettings struct {
	node, namespace, configFile, clientsFile, hardwareFile string
	poll                                                   time.Duration
}

func migSettingsFrom(getenv func(string) string) (migSettings, error) {
	settings := migSettings{node: getenv("NODE_NAME"), namespace: getenv("DEFAULT_GPU_CLIENTS_NAMESPACE"),
		configFile: firstSet(getenv, "CONFIG_FILE", "DEFAULT_CONFIG_FILE"), clientsFile: getenv("GPU_CLIENTS_FILE"),
		hardwareFile: hardwarePath(getenv), poll: 2 * time.Second}
	switch {
	case settings.node == "":
		return settings, fmt.Errorf("invalid -n <node-name> flag: must not be empty string (NODE_NAME)")
	case settings.configFile == "":
		return settings, fmt.Errorf("no MIG config: neither CONFIG_FILE nor DEFAULT_CONFIG_FILE is set " +
			"(the double cannot generate one from the hardware, as the real one does through NVML)")
	case settings.namespace == "":
		return settings, fmt.Errorf("DEFAULT_GPU_CLIENTS_NAMESPACE is not set (the operator sets its namespace)")
	}
	return settings, nil
}

// checkGPUClientsFile: the host's GPU clients (systemd services) as the real one parses them
// (yaml.Unmarshal: unknown keys are ignored, a file that is no YAML mapping is refused).
func checkGPUClientsFile(path string) error {
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("error parsing host's GPU clients file: read error: %w", err)
	}
	var clients struct {
		Version         string   `json:"version"`
		SystemdServices []string `json:"systemd-services"`
	}
	if err := yaml.Unmarshal(data, &clients); err != nil {
		return fmt.Errorf("error parsing host's GPU clients file: unmarshal error: %w", err)
	}
	return nil
}

type migManager struct {
	k        *kubeapi.Client
	settings migSettings
	// What the deploy labels were before a change, to put back.
	deployed map[string]string
}

func migManagerMain() {
	log.SetPrefix("nvidia-mig-manager TEST DOUBLE: ")
	settings, err := migSettingsFrom(os.Getenv)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := LoadMigParted(settings.configFile); err != nil {
		log.Fatalf("error parsing MIG config %s: %v", settings.configFile, err)
	}
	k, err := kubeapi.InCluster()
	if err != nil {
		log.Fatal(err)
	}
	m := &migManager{k: k, settings: settings}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	handled, first := "", true
	for {
		value, err := m.label(migConfigLabel)
		if err != nil {
			log.Printf("reading the node: %v", err)
		} else if first || value != handled {
			log.Printf("Updating to MIG config: %s", value)
			if err := m.reconfigure(value); err != nil {
				log.Printf("Error: %v", err)
			} else {
				log.Printf("Successfully updated to MIG config: %s", value)
			}
			handled, first = value, false
		}
		select {
		case <-stop:
			return
		case <-time.After(settings.poll):
		}
	}
}

func (m *migManager) node() (map[string]string, error) {
	var node struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	status, err := m.k.Do("GET", "/api/v1/nodes/"+m.settings.node, nil, &node)
	if err == nil && status == 404 {
		err = fmt.Errorf("node %s not found", m.settings.node)
	}
	return node.Metadata.Labels, err
}

func (m *migManager) label(key string) (string, error) {
	labels, err := m.node()
	return labels[key], err
}

func (m *migManager) setLabels(labels map[string]string) error {
	return m.k.MergePatch("/api/v1/nodes/"+m.settings.node, map[string]any{"metadata": map[string]any{"labels": labels}})
}

// deployLabels: each GPU client's deploy label at `value`, but those that were "false".
func (m *migManager) deployLabels(value string) map[string]string {
	labels := map[string]string{}
	for _, client := range migGPUClients {
		labels[client.label] = value
		if m.deployed[client.label] == "false" {
			labels[client.label] = "false"
		}
	}
	if m.deployed[gpuClientLabel] != "" {
		labels[gpuClientLabel] = value
		if m.deployed[gpuClientLabel] == "false" {
			labels[gpuClientLabel] = "false"
		}
	}
	return labels
}

// setState: the deploy labels back, then the state label (reconfigure's setState).
func (m *migManager) setState(state string) error {
	if err := m.setLabels(m.deployLabels("true")); err != nil {
		return err
	}
	return m.setLabels(map[string]string{migStateLabel: state})
}

func (m *migManager) fail(err error) error {
	if stateErr := m.setState("failed"); stateErr != nil {
		log.Printf("setting the state to failed: %v", stateErr)
	}
	return err
}

func (m *migManager) reconfigure(selected string) error {
	labels, err := m.node()
	if err != nil {
		return m.fail(fmt.Errorf("failed to get current node labels: %w", err))
	}
	m.deployed = labels
	if err := checkGPUClientsFile(m.settings.clientsFile); err != nil {
		return m.fail(err)
	}
	config, err := LoadMigParted(m.settings.configFile)
	if err != nil {
		return m.fail(fmt.Errorf("failed to validate MIG configuration: %w", err))
	}
	hardware, err := LoadHardware(m.settings.hardwareFile)
	if err != nil {
		return m.fail(err)
	}
	layout, err := config.Layout(selected, hardware)
	if err != nil {
		return m.fail(fmt.Errorf("failed to validate MIG configuration: %w", err))
	}
	if Applied(hardware, layout, false) {
		log.Printf("Selected MIG config is already applied")
		return m.setState("success")
	}
	if err := m.setLabels(map[string]string{migStateLabel: "pending"}); err != nil {
		return m.fail(fmt.Errorf("failed to set state to pending: %w", err))
	}
	if err := m.setLabels(m.deployLabels(migPaused)); err != nil {
		return m.fail(fmt.Errorf("failed to shutdown Kubernetes GPU clients: %w", err))
	}
	for _, client := range migGPUClients {
		if client.app == "" {
			continue
		}
		if err := m.waitGone("app=" + client.app); err != nil {
			return fmt.Errorf("%s pod did not shutdown: %w", client.app, err)
		}
	}
	if err := m.waitClientDaemonSetPodsGone(); err != nil {
		return fmt.Errorf("third-party gpu client pods did not shutdown: %w", err)
	}
	for _, validator := range []string{"app=nvidia-cuda-validator", "app=nvidia-device-plugin-validator"} {
		if err := m.deletePods(validator); err != nil {
			return fmt.Errorf("failed to delete %s pod: %w", validator, err)
		}
	}
	if err := WriteHardware(m.settings.hardwareFile, Apply(hardware, layout)); err != nil {
		return m.fail(fmt.Errorf("failed to apply MIG configuration: %w", err))
	}
	if err := m.deletePods("app=nvidia-operator-validator"); err != nil {
		return fmt.Errorf("failed to restart validator pod: %w", err)
	}
	return m.setState("success")
}

func (m *migManager) podsPath(selector string) string {
	query := url.Values{"fieldSelector": {"spec.nodeName=" + m.settings.node}, "labelSelector": {selector}}
	return fmt.Sprintf("/api/v1/namespaces/%s/pods?%s", m.settings.namespace, query.Encode())
}

func (m *migManager) pods(selector string) ([]string, error) {
	var list struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if _, err := m.k.Do("GET", m.podsPath(selector), nil, &list); err != nil {
		return nil, err
	}
	names := make([]string, len(list.Items))
	for i, item := range list.Items {
		names[i] = item.Metadata.Name
	}
	return names, nil
}

func (m *migManager) waitGone(selector string) error {
	deadline := time.Now().Add(migPodsTimeout)
	for {
		names, err := m.pods(selector)
		if err != nil {
			return err
		}
		if len(names) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still on the node after %v: %v", migPodsTimeout, names)
		}
		time.Sleep(time.Second)
	}
}

func (m *migManager) deletePods(selector string) error {
	names, err := m.pods(selector)
	if err != nil {
		return err
	}
	for _, name := range names {
		if _, err := m.k.Do("DELETE", fmt.Sprintf("/api/v1/namespaces/%s/pods/%s", m.settings.namespace, name), nil, nil); err != nil {
			return err
		}
	}
	return nil
}

// waitClientDaemonSetPodsGone: DaemonSet pods of any namespace on the node whose nodeSelector
// has gpu.deploy.client (third-party GPU clients) have left it.
func (m *migManager) waitClientDaemonSetPodsGone() error {
	deadline := time.Now().Add(migPodsTimeout)
	query := url.Values{"fieldSelector": {"spec.nodeName=" + m.settings.node}}
	for {
		var list struct {
			Items []struct {
				Metadata struct {
					Name            string `json:"name"`
					OwnerReferences []struct {
						Kind       string `json:"kind"`
						Controller bool   `json:"controller"`
					} `json:"ownerReferences"`
				} `json:"metadata"`
				Spec struct {
					NodeSelector map[string]string `json:"nodeSelector"`
				} `json:"spec"`
			} `json:"items"`
		}
		if _, err := m.k.Do("GET", "/api/v1/pods?"+query.Encode(), nil, &list); err != nil {
			return err
		}
		var left []string
		for _, pod := range list.Items {
			for _, owner := range pod.Metadata.OwnerReferences {
				if _, selects := pod.Spec.NodeSelector[gpuClientLabel]; owner.Controller && owner.Kind == "DaemonSet" && selects {
					left = append(left, pod.Metadata.Name)
				}
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still on the node after %v: %v", migPodsTimeout, left)
		}
		time.Sleep(5 * time.Second)
	}
}
