package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gpuboot.local/doubles/deviceplugin"
	"gpuboot.local/doubles/deviceplugin/plugintest"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// port writes one PCI network function into a sysfs tree as tests/doubles/hardware does.
func port(t *testing.T, sys, address, class, device, ifName, arphrd string, rdma ...string) {
	t.Helper()
	dir := filepath.Join(sys, "bus", "pci", "devices", address)
	files := map[string]string{"vendor": "0x15b3\n", "device": device + "\n", "class": class + "\n"}
	for name, text := range files {
		mustWrite(t, filepath.Join(dir, name), text)
	}
	if err := os.Symlink("/elsewhere/sys/bus/pci/drivers/mlx5_core", filepath.Join(dir, "driver")); err != nil {
		t.Fatal(err)
	}
	mustMkdir(t, filepath.Join(dir, "net", ifName))
	for _, name := range rdma {
		mustMkdir(t, filepath.Join(dir, "infiniband", name))
	}
	mustWrite(t, filepath.Join(sys, "class", "net", ifName, "type"), arphrd+"\n")
}

func mustWrite(t *testing.T, path, text string) {
	t.Helper()
	mustMkdir(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustMkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
}

// hgx: two ConnectX-7 InfiniBand ports with RDMA devices, a ConnectX-6 Dx Ethernet port, and a
// ConnectX-7 port whose driver made no RDMA device; an NVSwitch (not a network function).
func hgx(t *testing.T) string {
	sys := filepath.Join(t.TempDir(), "sys")
	port(t, sys, "0000:1a:00.0", "0x020700", "0x1021", "ens1f0np0", "32", "mlx5_0")
	port(t, sys, "0000:2a:00.0", "0x020700", "0x1021", "ens2f0np0", "32", "mlx5_1")
	port(t, sys, "0000:c1:00.0", "0x020000", "0x101d", "eno1np0", "1", "mlx5_2")
	port(t, sys, "0000:3a:00.0", "0x020700", "0x1021", "ens3f0np0", "32")
	mustWrite(t, filepath.Join(sys, "bus", "pci", "devices", "0000:05:00.0", "class"), "0x068000\n")
	return sys
}

func TestPortsAreThePCINetworkFunctionsWithTheirNetdevLinkAndRDMA(t *testing.T) {
	ports, err := Ports(hgx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 4 {
		t.Fatalf("ports %+v", ports)
	}
	first := ports[0]
	if first.PCIAddress != "0000:1a:00.0" || first.Vendor != "15b3" || first.DeviceID != "1021" ||
		first.Driver != "mlx5_core" || first.IfName != "ens1f0np0" || first.LinkType != "infiniband" ||
		strings.Join(first.RDMA, ",") != "mlx5_0" {
		t.Fatalf("first port %+v", first)
	}
	if ports[3].LinkType != "ether" {
		t.Fatalf("eno1np0 %+v", ports[3])
	}
	if _, err := Ports(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("a node without the double tree was read")
	}
}

func TestTheConfigIsRefusedAsTheRealPluginRefusesIt(t *testing.T) {
	for config, said := range map[string]string{
		`{"configList": []}`: "no resources configuration found",
		`{"configList": [{"resourceName": "ib-shared", "rdmaHcaMax": 1, "selectors": {"vendors": ["15b3"]}}]}`: "contains invalid characters",
		`{"configList": [{"resourceName": "a", "rdmaHcaMax": 1, "selectors": {"vendors": ["15b3"]}},
		                 {"resourceName": "a", "rdmaHcaMax": 1, "selectors": {"vendors": ["15b3"]}}]}`: "already exists",
		`{"configList": [{"resourceName": "a", "rdmaHcaMax": -1, "selectors": {"vendors": ["15b3"]}}]}`:                    "rdmaHcaMax < 0",
		`{"configList": [{"resourceName": "a", "rdmaHcaMax": 1}]}`:                                                         "neither",
		`{"configList": [{"resourceName": "a", "rdmaHcaMax": 1, "devices": ["ib0"], "selectors": {"vendors": ["15b3"]}}]}`: "Cannot specify both",
		`{"periodicUpdateInterval": -1, "configList": [{"resourceName": "a", "rdmaHcaMax": 1, "devices": ["ib0"]}]}`:       "periodicUpdateInterval",
		`{"configList": [`: "error unmarshalling",
	} {
		if _, err := LoadRdmaConfig(writeConfig(t, config)); err == nil || !strings.Contains(err.Error(), said) {
			t.Errorf("%s: got %v, want %q", config, err, said)
		}
	}
	configs, err := LoadRdmaConfig(writeConfig(t, `{"configList": [{"resourceName": "a", "rdmaHcaMax": 3, "devices": ["ens1f0np0"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if configs[0].ResourcePrefix != "rdma" || strings.Join(configs[0].Selectors.IfNames, ",") != "ens1f0np0" {
		t.Fatalf("the defaults: %+v", configs[0])
	}
}

func writeConfig(t *testing.T, text string) string {
	path := filepath.Join(t.TempDir(), "config.json")
	mustWrite(t, path, text)
	return path
}

func TestEachResourceAdvertisesRdmaHcaMaxWhereItsSelectorsTakeAPortWithRDMA(t *testing.T) {
	ports, err := Ports(hgx(t))
	if err != nil {
		t.Fatal(err)
	}
	configs, err := LoadRdmaConfig(writeConfig(t, `{"configList": [
	  {"resourceName": "ib_shared", "resourcePrefix": "nvidia.com", "rdmaHcaMax": 63,
	   "selectors": {"vendors": ["15b3"], "ifNames": ["ens1f0np0", "ens2f0np0"], "linkTypes": ["infiniband"]}},
	  {"resourceName": "roce", "resourcePrefix": "nvidia.com", "rdmaHcaMax": 8,
	   "selectors": {"vendors": ["15b3"], "linkTypes": ["ether"], "deviceIDs": ["1021"]}},
	  {"resourceName": "no_rdma", "rdmaHcaMax": 5, "selectors": {"ifNames": ["ens3f0np0"]}},
	  {"resourceName": "by_driver", "rdmaHcaMax": 2, "selectors": {"drivers": ["mlx5_core"], "deviceIDs": ["101d"]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, resource := range SharedResources(configs, ports) {
		got[resource.Name] = resource.Devices
	}
	want := map[string]int{"nvidia.com/ib_shared": 63, "nvidia.com/roce": 0, "rdma/no_rdma": 0, "rdma/by_driver": 2}
	for name, count := range want {
		if got[name] != count {
			t.Errorf("%s: %d devices, want %d (all: %v)", name, got[name], count, got)
		}
	}
}

func TestThePluginRegistersItsResourcesAndListsThem(t *testing.T) {
	resource := SharedResource{Name: "nvidia.com/ib_shared", Socket: "ib_shared.sock", Devices: 3}
	served := []deviceplugin.Resource{{Name: resource.Name, Endpoint: resource.Socket,
		Server: &sharedPlugin{resource: resource, charDevices: t.TempDir()}}}
	kubelet, dir := plugintest.Started(t, 1, func(ctx context.Context, dir string) { _ = deviceplugin.Serve(ctx, dir, served) })
	if got := kubelet.Registered(); len(got) != 1 || got[0] != "nvidia.com/ib_shared@ib_shared.sock" {
		t.Fatalf("registered %v", got)
	}
	client, listed := plugintest.Listed(t, dir, "ib_shared.sock")
	if len(listed) != 3 || listed[2].ID != "2" || listed[2].Health != api.Healthy {
		t.Fatalf("listed %v", listed)
	}
	ctx := context.Background()
	allocated, err := client.Allocate(ctx, &api.AllocateRequest{ContainerRequests: []*api.ContainerAllocateRequest{
		{DevicesIds: []string{"1"}}}})
	if err != nil || len(allocated.ContainerResponses) != 1 || len(allocated.ContainerResponses[0].Devices) != 0 {
		t.Fatalf("allocated %v, %v (no character devices on this host)", allocated, err)
	}
}
