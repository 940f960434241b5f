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
	"testing"
	"time"
)

func h100s(n int) *Hardware {
	hw := &Hardware{}
	for i := 0; i < n; i++ {
		hw.GPUs = append(hw.GPUs, GPU{Index: i, UUID: "GPU-" + string(rune('a'+i)), Product: "NVIDIA H100 80GB HBM3",
			MIGCapable: true, Family: "hopper", MemoryMiB: 81559})
	}
	return hw
}

func TestTheOperatorsGFDEnvIsAcceptedAndWhatTheRealOneRefusesIsNot(t *testing.T) {
	env := map[string]string{"GFD_SLEEP_INTERVAL": "60s", "GFD_FAIL_ON_INIT_ERROR": "true", "NAMESPACE": "gpu-operator",
		"NODE_NAME": "gpu1", "POD_NAME": "gpu-feature-discovery-x"}
	settings, err := gfdSettingsFrom(from(env))
	if err != nil || !settings.useNodeFeatureAPI || settings.interval != time.Minute {
		t.Fatal(settings, err)
	}
	for name, change := range map[string]map[string]string{
		"an interval that is no duration":   {"GFD_SLEEP_INTERVAL": "often"},
		"the NodeFeature API with no node":  {"NODE_NAME": ""},
		"a node feature switch not boolean": {"USE_NODE_FEATURE_API": "maybe"},
	} {
		bad := map[string]string{}
		for k, v := range env {
			bad[k] = v
		}
		for k, v := range change {
			bad[k] = v
		}
		if _, err := gfdSettingsFrom(from(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestGFDLabelsWholeGPUs(t *testing.T) {
	labels, err := gfdLabels(h100s(8), &Config{Version: "v1"}, time.Unix(100, 0), false)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
		"nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/mig.capable": "true",
		"nvidia.com/mig.strategy": "none", "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.memory": "81559",
		"nvidia.com/gfd.timestamp": "100"}
	if len(labels) != len(want) {
		t.Fatal(labels)
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("%s=%q, want %q", k, labels[k], v)
		}
	}
}

func TestGFDLabelsTimeSlicingAndMIG(t *testing.T) {
	four := &Config{Version: "v1", Sharing: Sharing{TimeSlicing: &Replicated{Resources: []ReplicatedResource{{Name: "nvidia.com/gpu", Replicas: 4}}}}}
	labels, _ := gfdLabels(h100s(2), four, time.Now(), true)
	if labels["nvidia.com/gpu.product"] != "NVIDIA-H100-80GB-HBM3-SHARED" || labels["nvidia.com/gpu.replicas"] != "4" ||
		labels["nvidia.com/gpu.sharing-strategy"] != "time-slicing" || labels["nvidia.com/gfd.timestamp"] != "" {
		t.Fatal(labels)
	}
	mixed := "mixed"
	hw := h100s(1)
	hw.GPUs[0].MIG = []MIGDevice{{UUID: "MIG-1", Profile: "1g.10gb"}, {UUID: "MIG-2", Profile: "1g.10gb"}}
	labels, _ = gfdLabels(hw, &Config{Version: "v1", Flags: Flags{MigStrategy: &mixed}}, time.Now(), true)
	if labels["nvidia.com/mig-1g.10gb.count"] != "2" || labels["nvidia.com/mig.strategy"] != "mixed" {
		t.Fatal(labels)
	}
}

func TestFeatureFileAsNFDReadsIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "features.d", "gfd")
	if err := writeFeatureFile(path, map[string]string{"nvidia.com/gpu.count": "2", "nvidia.com/gpu.family": "hopper"}); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if string(data) != "nvidia.com/gpu.count=2\nnvidia.com/gpu.family=hopper\n" {
		t.Fatalf("%q", data)
	}
}

// An API server that has no NodeFeature yet, and the GFD pod owned by its DaemonSet.
func TestTheNodeFeatureIsCreatedForTheNodeAndOwnedByGFDsDaemonSet(t *testing.T) {
	var created map[string]any
	server := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer token" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		switch {
		case r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/nodefeatures/nvidia-features-for-gpu1"):
			w.WriteHeader(http.StatusNotFound)
		case r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/pods/gfd-x"):
			io.WriteString(w, `{"metadata":{"ownerReferences":[{"apiVersion":"apps/v1","kind":"DaemonSet","name":"gpu-feature-discovery","uid":"u1"}]}}`)
		case r.Method == "POST" && r.URL.Path == "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/gpu-operator/nodefeatures":
			json.NewDecoder(r.Body).Decode(&created)
			// As NodeFeature's CRD: spec.features and spec.labels are required.
			spec, _ := created["spec"].(map[string]any)
			if _, ok := spec["features"].(map[string]any); !ok || spec["labels"] == nil {
				w.WriteHeader(http.StatusUnprocessableEntity)
				return
			}
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "{}")
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	defer server.Close()
	k := &kubeapi.Client{Base: server.URL, Token: "token", HTTP: server.Client()}
	settings := gfdSettings{node: "gpu1", namespace: "gpu-operator", pod: "gfd-x"}
	if err := publishNodeFeature(k, settings, map[string]string{"nvidia.com/gpu.count": "2"}); err != nil {
		t.Fatal(err)
	}
	meta := created["metadata"].(map[string]any)
	owner := meta["ownerReferences"].([]any)[0].(map[string]any)
	if meta["name"] != "nvidia-features-for-gpu1" || meta["labels"].(map[string]any)[nodeNameLabel] != "gpu1" ||
		owner["name"] != "gpu-feature-discovery" ||
		created["spec"].(map[string]any)["labels"].(map[string]any)["nvidia.com/gpu.count"] != "2" {
		t.Fatal(created)
	}
}

func TestDCGMNeedsItsCollectorsAndThePodResources(t *testing.T) {
	env := map[string]string{"DCGM_EXPORTER_LISTEN": ":9400", "DCGM_EXPORTER_KUBERNETES": "true",
		"DCGM_EXPORTER_COLLECTORS": "/etc/dcgm-exporter/dcp-metrics-included.csv", "NODE_NAME": "gpu1"}
	all := func(string) bool { return true }
	if _, err := dcgmSettingsFrom(from(env), all); err != nil {
		t.Fatal(err)
	}
	noSocket := func(path string) bool { return path != podResourcesSocket }
	if _, err := dcgmSettingsFrom(from(env), noSocket); err == nil {
		t.Fatal("no pod-resources socket accepted")
	}
	if _, err := dcgmSettingsFrom(from(env), func(string) bool { return false }); err == nil {
		t.Fatal("no collectors file accepted")
	}
	text := metrics(h100s(2), "gpu1")
	if strings.Count(text, "DCGM_FI_DEV_GPU_UTIL{") != 2 || !strings.Contains(text, `UUID="GPU-b"`) {
		t.Fatal(text)
	}
}
