package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"gpuboot.local/doubles/deviceplugin"
	"gpuboot.local/doubles/deviceplugin/plugintest"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func sriovConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "hgx01")
	mustWrite(t, path, text)
	return path
}

func TestTheConfigIsReadWithTheRealPluginsRules(t *testing.T) {
	for text, want := range map[string]string{
		`{"resourceList": [{"resourceName": "ib-vf"}]}`:                          `resource name "ib-vf" contains invalid characters`,
		`{"resourceList": [{"resourceName": "a"}, {"resourceName": "a"}]}`:       `resource name "nvidia.com/a" already exists`,
		`{"resourceList": [{"resourceName": "a", "deviceType": "accelerator"}]}`: `unsupported deviceType:  "accelerator"`,
		`{"resourceList": [{"resourceName": "a", "selectors": "x"}]}`:            "error unmarshalling selectors",
		`resourceList:`: "please make sure the config is in json format",
	} {
		if _, err := LoadSriovConfig(sriovConfig(t, text), "nvidia.com"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", text, err, want)
		}
	}
	if _, err := LoadSriovConfig(filepath.Join(t.TempDir(), "absent"), "nvidia.com"); err == nil ||
		!strings.HasPrefix(err.Error(), "error reading file") {
		t.Errorf("absent config: %v", err)
	}
	got, err := LoadSriovConfig(sriovConfig(t, `{"resourceList": [{"resourceName": "ib_vf", "selectors": {"pfNames": ["ens1f0np0"]}},
		{"resourceName": "roce_vf", "resourcePrefix": "example.com", "selectors": [{"devices": ["101e"]}, {"rootDevices": ["0000:2a:00.0"]}]}]}`), "nvidia.com")
	if err != nil || len(got) != 2 || got[0].Name != "nvidia.com/ib_vf" || got[0].Socket != "ib_vf.sock" ||
		got[1].Name != "example.com/roce_vf" || len(got[1].Selectors) != 2 {
		t.Fatalf("%+v, %v", got, err)
	}
}

// The operator's config for the sample's groups, over a tree where the config daemon made VFs.
func TestEachResourceTakesTheVFsItsSelectorsMatch(t *testing.T) {
	sys := sriovTree(t)
	for address, count := range map[string]int{"0000:1a:00.0": 4, "0000:2a:00.0": 2, "0000:3a:00.0": 2} {
		if err := MakeVFs(sys, address, count); err != nil {
			t.Fatal(err)
		}
	}
	functions, err := Functions(sys)
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range functions {
		if fn.PCIAddress == "0000:1a:00.0" {
			t.Fatal("a PF whose VFs are made is handed out")
		}
	}
	configured, err := LoadSriovConfig(sriovConfig(t, `{"resourceList": [
		{"resourceName": "ib_vf", "selectors": {"vendors": ["15b3"], "pfNames": ["ens1f0np0", "ens2f0np0#1-1"], "linkTypes": ["infiniband"], "isRdma": true}},
		{"resourceName": "by_root", "selectors": {"rootDevices": ["0000:3a:00.0"], "devices": ["101e"]}},
		{"resourceName": "rdma_only", "selectors": {"rootDevices": ["0000:3a:00.0"], "isRdma": true}},
		{"resourceName": "eth_pf", "selectors": {"devices": ["101d"], "linkTypes": ["ether"]}},
		{"resourceName": "none", "selectors": {"pfNames": ["ens9f0np0"]}}]}`), "nvidia.com")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, resource := range SriovResources(configured, functions) {
		got[resource.Name] = resource.Devices
	}
	want := map[string]string{
		"nvidia.com/ib_vf":   "0000:1a:00.2 0000:1a:00.3 0000:1a:00.4 0000:1a:00.5 0000:2a:00.3",
		"nvidia.com/by_root": "0000:3a:00.2 0000:3a:00.3",
		// the port without an RDMA device has VFs without one
		"nvidia.com/rdma_only": "",
		// a PF without VFs is a device of its own
		"nvidia.com/eth_pf": "0000:c1:00.0",
		"nvidia.com/none":   "",
	}
	for name, devices := range want {
		if strings.Join(got[name], " ") != devices {
			t.Errorf("%s: %v, want %s", name, got[name], devices)
		}
	}
}

func TestTheResourcesRegisterAndAllocateAsTheRealPluginDoes(t *testing.T) {
	resource := SriovResource{Name: "nvidia.com/ib_vf", Socket: "ib_vf.sock", Devices: []string{"0000:1a:00.2", "0000:1a:00.3"}}
	served := []deviceplugin.Resource{{Name: resource.Name, Endpoint: resource.Socket, Server: &sriovPlugin{resource: resource}}}
	kubelet, dir := plugintest.Started(t, 1, func(ctx context.Context, dir string) { _ = deviceplugin.Serve(ctx, dir, served) })
	if got := kubelet.Registered(); len(got) != 1 || got[0] != "nvidia.com/ib_vf@ib_vf.sock" {
		t.Fatalf("registered %v", got)
	}
	client, listed := plugintest.Listed(t, dir, "ib_vf.sock")
	if len(listed) != 2 || listed[1].ID != "0000:1a:00.3" || listed[1].Health != api.Healthy {
		t.Fatalf("listed %v", listed)
	}
	allocated, err := client.Allocate(context.Background(), &api.AllocateRequest{ContainerRequests: []*api.ContainerAllocateRequest{
		{DevicesIds: []string{"0000:1a:00.3", "0000:1a:00.2"}}}})
	if err != nil || allocated.ContainerResponses[0].Envs["PCIDEVICE_NVIDIA_COM_IB_VF"] != "0000:1a:00.3,0000:1a:00.2" {
		t.Fatalf("allocated %v, %v", allocated, err)
	}
	if _, err := client.Allocate(context.Background(), &api.AllocateRequest{ContainerRequests: []*api.ContainerAllocateRequest{
		{DevicesIds: []string{"0000:9f:00.2"}}}}); err == nil {
		t.Fatal("allocated a device it does not list")
	}
}
