package main

import (
	"encoding/json"
	"gpuboot.local/doubles/kubeapi"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

const gpubootMigConfig = `
version: v1
mig-configs:
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  all-disabled:
    - devices: all
      mig-enabled: false
  half:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.40gb": 1, "1g.10gb": 2}
`

func TestWhatTheRealMigPartedRefusesIsRefused(t *testing.T) {
	if _, err := ParseMigParted([]byte(gpubootMigConfig)); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"no version":             "mig-configs: {a: [{devices: all, mig-enabled: false}]}",
		"another version":        "version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}",
		"an unknown top field":   "version: v1\nmig-config: {}",
		"no entries":             "version: v1\nmig-configs: {}",
		"an empty layout":        "version: v1\nmig-configs: {a: []}",
		"no devices":             "version: v1\nmig-configs: {a: [{mig-enabled: false}]}",
		"no mig-enabled":         "version: v1\nmig-configs: {a: [{devices: all}]}",
		"devices some":           "version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}",
		"an unknown entry field": "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, mig-device: {}}]}",
		"a profile misspelt":     "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1g10gb: 7}}]}",
		"a negative count":       "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1g.10gb: -1}}]}",
		"all counts 0":           "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1g.10gb: 0}}]}",
	} {
		if _, err := ParseMigParted([]byte(text)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestALayoutIsAppliedToTheGPUsItSelectsAndAssertedAfter(t *testing.T) {
	config, _ := ParseMigParted([]byte(gpubootMigConfig))
	hardware := h100s(2)
	layout, err := config.Layout("all-1g.10gb", hardware)
	if err != nil || len(layout) != 2 {
		t.Fatal(layout, err)
	}
	if Applied(hardware, layout, false) || Applied(hardware, layout, true) {
		t.Fatal("MIG is off: neither the layout nor the mode is applied")
	}
	after := Apply(hardware, layout)
	if !Applied(after, layout, false) || len(after.GPUs[1].MIG) != 7 || after.GPUs[1].MIG[6].Profile != "1g.10gb" {
		t.Fatal(after)
	}
	if len(hardware.GPUs[0].MIG) != 0 {
		t.Fatal("Apply changed its input")
	}
	// The mixed strategy then advertises them, as the device plugin does after the change.
	resources, err := Resources(after, &Config{Version: "v1", Flags: Flags{MigStrategy: strPtr("mixed")}})
	if err != nil || len(resources["nvidia.com/mig-1g.10gb"]) != 14 || len(resources["nvidia.com/gpu"]) != 0 {
		t.Fatal(resources, err)
	}
	// One GPU only; the other keeps what it had.
	half, _ := config.Layout("half", after)
	partly := Apply(after, half)
	if len(partly.GPUs[0].MIG) != 3 || len(partly.GPUs[1].MIG) != 7 || !Applied(partly, half, false) {
		t.Fatal(partly)
	}
	off, _ := config.Layout("all-disabled", partly)
	disabled := Apply(partly, off)
	if disabled.GPUs[0].migMode() || disabled.GPUs[1].migMode() {
		t.Fatal(disabled)
	}
}

func TestALayoutAGPUCannotHoldIsRefusedAsNVMLWould(t *testing.T) {
	for name, text := range map[string]string{
		"more than 7 slices":             "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {2g.20gb: 4}}]}",
		"more than its memory":           "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1g.20gb: 7}}]}",
		"a GPU it lacks":                 "version: v1\nmig-configs: {a: [{devices: [0, 2], mig-enabled: false}]}",
		"a GPU twice":                    "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false}, {devices: [1], mig-enabled: false}]}",
		"a device filter it cannot read": "version: v1\nmig-configs: {a: [{device-filter: \"0x233010DE\", devices: all, mig-enabled: false}]}",
	} {
		config, err := ParseMigParted([]byte(text))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := config.Layout("a", h100s(2)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	config, _ := ParseMigParted([]byte(gpubootMigConfig))
	if _, err := config.Layout("all-3g.40gb", h100s(2)); err == nil || !strings.Contains(err.Error(), "not present") {
		t.Errorf("a layout the file lacks: %v", err)
	}
	l40s := &Hardware{GPUs: []GPU{{Index: 0, UUID: "GPU-l", Product: "NVIDIA L40S", Family: "ada-lovelace", MemoryMiB: 46068}}}
	if _, err := config.Layout("all-1g.10gb", l40s); err == nil || !strings.Contains(err.Error(), "does not support MIG") {
		t.Errorf("MIG on a GPU without it: %v", err)
	}
	// A device filter selects by PCI id where the hardware file gives one.
	filtered, _ := ParseMigParted([]byte("version: v1\nmig-configs: {a: [{device-filter: [\"0x233010DE\"], devices: all, mig-enabled: true}]}"))
	mixed := h100s(2)
	mixed.GPUs[0].PCIDeviceID, mixed.GPUs[1].PCIDeviceID = "0x233010de", "0x26B910DE"
	layout, err := filtered.Layout("a", mixed)
	if _, second := layout[1]; err != nil || len(layout) != 1 || second {
		t.Fatal(layout, err)
	}
}

func strPtr(s string) *string { return &s }

// fakeNode: an API server with one node and the GPU clients' pods on it, that deletes a
// client's pods when its deploy label is paused, as the DaemonSet controller would.
type fakeNode struct {
	sync.Mutex
	labels  map[string]string
	pods    map[string]string // name -> app label
	patches []map[string]string
	deleted []string
}

func (f *fakeNode) serve(t *testing.T) *httptest.Server {
	return httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.Lock()
		defer f.Unlock()
		switch {
		case r.Method == "GET" && r.URL.Path == "/api/v1/nodes/gpu2":
			json.NewEncoder(w).Encode(map[string]any{"metadata": map[string]any{"labels": f.labels}})
		case r.Method == "PATCH" && r.URL.Path == "/api/v1/nodes/gpu2":
			if r.Header.Get("Content-Type") != "application/merge-patch+json" {
				w.WriteHeader(http.StatusUnsupportedMediaType)
				return
			}
			var patch struct {
				Metadata struct {
					Labels map[string]string `json:"labels"`
				} `json:"metadata"`
			}
			json.NewDecoder(r.Body).Decode(&patch)
			f.patches = append(f.patches, patch.Metadata.Labels)
			for k, v := range patch.Metadata.Labels {
				f.labels[k] = v
				if v == migPaused {
					for name, app := range f.pods {
						for _, client := range migGPUClients {
							if client.label == k && client.app == app {
								delete(f.pods, name)
							}
						}
					}
				}
			}
			io.WriteString(w, "{}")
		case r.Method == "GET" && r.URL.Path == "/api/v1/pods":
			io.WriteString(w, `{"items": []}`)
		case r.Method == "GET" && r.URL.Path == "/api/v1/namespaces/gpu-operator/pods":
			if r.URL.Query().Get("fieldSelector") != "spec.nodeName=gpu2" {
				t.Errorf("pods listed beyond the node: %v", r.URL.RawQuery)
			}
			app := strings.TrimPrefix(r.URL.Query().Get("labelSelector"), "app=")
			var items []map[string]any
			for name, label := range f.pods {
				if label == app {
					items = append(items, map[string]any{"metadata": map[string]any{"name": name}})
				}
			}
			json.NewEncoder(w).Encode(map[string]any{"items": items})
		case r.Method == "DELETE" && strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/gpu-operator/pods/"):
			name := filepath.Base(r.URL.Path)
			f.deleted = append(f.deleted, name)
			delete(f.pods, name)
			io.WriteString(w, "{}")
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
}

func TestAChangeIsMadeWithTheGPUClientsAwayAndTheStateSaysSoAfter(t *testing.T) {
	dir := t.TempDir()
	hardwareFile, configFile := filepath.Join(dir, "gpus.json"), filepath.Join(dir, "config.yaml")
	os.WriteFile(configFile, []byte(gpubootMigConfig), 0o644)
	if err := WriteHardware(hardwareFile, h100s(2)); err != nil {
		t.Fatal(err)
	}
	f := &fakeNode{
		labels: map[string]string{migConfigLabel: "all-1g.10gb", "nvidia.com/gpu.deploy.device-plugin": "true",
			"nvidia.com/gpu.deploy.gpu-feature-discovery": "true", "nvidia.com/gpu.deploy.dcgm-exporter": "false"},
		pods: map[string]string{"dp-1": "nvidia-device-plugin-daemonset", "gfd-1": "gpu-feature-discovery",
			"validator-1": "nvidia-operator-validator"},
	}
	server := f.serve(t)
	defer server.Close()
	m := &migManager{k: &kubeapi.Client{Base: server.URL, Token: "token", HTTP: server.Client()},
		settings: migSettings{node: "gpu2", namespace: "gpu-operator", configFile: configFile, hardwareFile: hardwareFile}}
	if err := m.reconfigure("all-1g.10gb"); err != nil {
		t.Fatal(err)
	}
	after, err := LoadHardware(hardwareFile)
	if err != nil || len(after.GPUs[0].MIG) != 7 {
		t.Fatal(after, err)
	}
	// pending, then the clients paused (the exporter that was off stays off), then back, then success.
	if f.patches[0][migStateLabel] != "pending" || f.patches[1]["nvidia.com/gpu.deploy.device-plugin"] != migPaused ||
		f.patches[1]["nvidia.com/gpu.deploy.dcgm-exporter"] != "false" {
		t.Fatal(f.patches)
	}
	if f.labels[migStateLabel] != "success" || f.labels["nvidia.com/gpu.deploy.device-plugin"] != "true" ||
		f.labels["nvidia.com/gpu.deploy.dcgm-exporter"] != "false" {
		t.Fatal(f.labels)
	}
	if len(f.deleted) != 1 || f.deleted[0] != "validator-1" {
		t.Fatal("the operator validator's pod is deleted, to validate again:", f.deleted)
	}
	// Once applied, the same label is only confirmed: no client is paused again.
	f.patches = nil
	if err := m.reconfigure("all-1g.10gb"); err != nil || f.labels[migStateLabel] != "success" {
		t.Fatal(err, f.labels)
	}
	for _, patch := range f.patches {
		for _, value := range patch {
			if value == migPaused || value == "pending" {
				t.Fatal("an applied layout paused the clients again:", f.patches)
			}
		}
	}
	// A layout the file lacks: failed, the clients' labels as they were.
	if err := m.reconfigure("all-3g.40gb"); err == nil || f.labels[migStateLabel] != "failed" ||
		f.labels["nvidia.com/gpu.deploy.device-plugin"] != "true" {
		t.Fatal(err, f.labels)
	}
}

func TestTheOperatorsEnvIsWhatItNeeds(t *testing.T) {
	env := map[string]string{"NODE_NAME": "gpu2", "CONFIG_FILE": "/mig-parted-config/config.yaml",
		"DEFAULT_GPU_CLIENTS_NAMESPACE": "gpu-operator", "GPU_CLIENTS_FILE": "/gpu-clients/clients.yaml",
		"DRIVER_ROOT_CTR_PATH": "/host"}
	settings, err := migSettingsFrom(from(env))
	if err != nil || settings.hardwareFile != "/host/run/gpuboot-double/gpus.json" {
		t.Fatal(settings, err)
	}
	delete(env, "CONFIG_FILE")
	env["DEFAULT_CONFIG_FILE"] = "/mig-parted-config/config-default.yaml"
	if settings, err := migSettingsFrom(from(env)); err != nil || settings.configFile != env["DEFAULT_CONFIG_FILE"] {
		t.Fatal(settings, err)
	}
	for _, key := range []string{"NODE_NAME", "DEFAULT_CONFIG_FILE", "DEFAULT_GPU_CLIENTS_NAMESPACE"} {
		bad := map[string]string{}
		for k, v := range env {
			if k != key {
				bad[k] = v
			}
		}
		if _, err := migSettingsFrom(from(bad)); err == nil {
			t.Errorf("without %s: accepted", key)
		}
	}
	dir := t.TempDir()
	clients := filepath.Join(dir, "clients.yaml")
	os.WriteFile(clients, []byte("version: v1\nsystemd-services: [nvsm.service]\n"), 0o644)
	if err := checkGPUClientsFile(clients); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(clients, []byte("- not\n- a mapping\n"), 0o644)
	if err := checkGPUClientsFile(clients); err == nil {
		t.Fatal("a clients file that is no mapping: accepted")
	}
}
