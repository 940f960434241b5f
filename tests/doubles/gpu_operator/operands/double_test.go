package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gpuboot.local/doubles/deviceplugin/plugintest"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func write(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const twoL40S = `{"gpus": [{"index": 0, "uuid": "GPU-a", "product": "NVIDIA-L40S"},
                          {"index": 1, "uuid": "GPU-b", "product": "NVIDIA-L40S"}]}`
const twoH100All1g = `{"gpus": [
  {"index": 0, "uuid": "GPU-a", "product": "NVIDIA-H100-80GB-HBM3", "mig": [
    {"uuid": "MIG-a0", "profile": "1g.10gb"}, {"uuid": "MIG-a1", "profile": "1g.10gb"}]},
  {"index": 1, "uuid": "GPU-b", "product": "NVIDIA-H100-80GB-HBM3", "mig": [
    {"uuid": "MIG-b0", "profile": "1g.10gb"}, {"uuid": "MIG-b1", "profile": "2g.20gb"}]}]}`

func counts(t *testing.T, config, hardware string) map[string]int {
	t.Helper()
	configPath := ""
	if config != "" {
		configPath = write(t, "config.yaml", config)
	}
	resources, err := load(configPath, write(t, "gpus.json", hardware))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for name, devices := range resources {
		out[name] = len(devices)
	}
	return out
}

func same(t *testing.T, got, want map[string]int) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestWholeGPUsWithoutAConfig(t *testing.T) {
	same(t, counts(t, "", twoL40S), map[string]int{"nvidia.com/gpu": 2})
}

func TestTimeSlicedReplicasKeepTheNameUnlessRenamed(t *testing.T) {
	sliced := "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
	same(t, counts(t, sliced, twoL40S), map[string]int{"nvidia.com/gpu": 8})
	renamed := "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: gpu\n      replicas: 2\n"
	same(t, counts(t, renamed, twoL40S), map[string]int{"nvidia.com/gpu.shared": 4})
}

func TestMIGStrategies(t *testing.T) {
	mixed := "version: v1\nflags:\n  migStrategy: mixed\n"
	same(t, counts(t, mixed, twoH100All1g), map[string]int{"nvidia.com/mig-1g.10gb": 3, "nvidia.com/mig-2g.20gb": 1})
	// single: one profile on every GPU, or the plugin refuses the node's layout.
	single := "version: v1\nflags:\n  migStrategy: single\n"
	if _, err := load(write(t, "c.yaml", single), write(t, "g.json", twoH100All1g)); err == nil ||
		!strings.Contains(err.Error(), "2 MIG profiles") {
		t.Fatalf("mixed profiles under the single strategy: %v", err)
	}
	oneProfile := strings.Replace(twoH100All1g, "2g.20gb", "1g.10gb", 1)
	same(t, counts(t, single, oneProfile), map[string]int{"nvidia.com/gpu": 4})
	// none: whole GPUs, MIG or not.
	same(t, counts(t, "", twoH100All1g), map[string]int{"nvidia.com/gpu": 2})
}

func TestTheRealPluginsRefusals(t *testing.T) {
	for config, said := range map[string]string{
		"version: v2\n":                                                                                       "unknown version: v2",
		"flags:\n  migStrategy: some\n":                                                                       "invalid strategy: some",
		"sharing:\n  timeSlicing:\n    resources: []\n":                                                       "no resources specified",
		"sharing:\n  timeSlicing:\n    resources:\n    - replicas: 2\n":                                       "no resource name specified",
		"sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n":                                         "no replicas specified",
		"sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 1\n":                      "number of replicas must be >= 2",
		"sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: some\n": "only valid string input is 'all'",
		"sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: 0\n":    "must be > 0",
	} {
		if _, err := LoadConfig(write(t, "c.yaml", config)); err == nil || !strings.Contains(err.Error(), said) {
			t.Errorf("%q: got %v, want %q", config, err, said)
		}
	}
	if _, err := LoadHardware(write(t, "g.json", `{"gpus": [{"uuid": "GPU-a", "model": "x"}]}`)); err == nil {
		t.Error("a hardware file with an unknown key was read")
	}
}

func TestRegistersListsAndAllocates(t *testing.T) {
	resources, err := load(write(t, "c.yaml", "sharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n"+
		"    resources:\n    - name: gpu\n      replicas: 4\n"), write(t, "g.json", twoL40S))
	if err != nil {
		t.Fatal(err)
	}
	kubelet, dir := plugintest.Started(t, 1, func(ctx context.Context, dir string) {
		_ = Serve(ctx, dir, resources, Settings{StrictShare: true, Listing: Listing{EnvVar: true}})
	})
	if got := kubelet.Registered()[0]; got != "nvidia.com/gpu@nvidia-gpu.sock" {
		t.Fatalf("registered %s", got)
	}
	client, listed := plugintest.Listed(t, dir, "nvidia-gpu.sock")
	if len(listed) != 8 || listed[5].ID != "GPU-b::1" || listed[5].Health != api.Healthy {
		t.Fatalf("listed %v", listed)
	}
	ctx := context.Background()
	allocated, err := client.Allocate(ctx, &api.AllocateRequest{ContainerRequests: []*api.ContainerAllocateRequest{
		{DevicesIds: []string{"GPU-b::3"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if env := allocated.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"]; env != "GPU-b" {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES=%s", env)
	}
	if _, err := client.Allocate(ctx, &api.AllocateRequest{ContainerRequests: []*api.ContainerAllocateRequest{
		{DevicesIds: []string{"GPU-a::0", "GPU-a::1"}}}}); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("two shared replicas with failRequestsGreaterThanOne: %v", err)
	}
	// Registering again after a kubelet restart: tests/doubles/deviceplugin's own test.
}
