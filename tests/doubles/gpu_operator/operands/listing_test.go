package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// The GPU Operator v26.7 with CDI on gives the plugin these, and its entrypoint sources the
// validator's driver-ready file for a host driver.
func operatorEnv(ctrRoot string) map[string]string {
	return map[string]string{
		"CDI_ENABLED": "true", "DEVICE_LIST_STRATEGY": "cdi-annotations,cdi-cri", "CDI_ANNOTATION_PREFIX": "cdi.k8s.io/",
		"DEVICE_ID_STRATEGY": "uuid", "PASS_DEVICE_SPECS": "true", "FAIL_ON_INIT_ERROR": "true",
		"NVIDIA_DRIVER_ROOT": "/", "DRIVER_ROOT_CTR_PATH": ctrRoot, "IS_HOST_DRIVER": "true",
	}
}

func from(env map[string]string) func(string) string { return func(k string) string { return env[k] } }

func TestTheOperatorsCDIListingIsAccepted(t *testing.T) {
	listing, err := listingFrom(from(operatorEnv("/host")))
	if err != nil {
		t.Fatal(err)
	}
	if listing.EnvVar || !listing.CDIAnnotations || !listing.CDICRI || listing.DriverRootCtrPath != "/host" {
		t.Fatalf("%+v", listing)
	}
	if got := hardwarePath(from(operatorEnv("/host"))); got != "/host/run/gpuboot-double/gpus.json" {
		t.Fatal(got)
	}
	// With no strategy given: the env var, as the real plugin's default.
	if listing, _ := listingFrom(from(map[string]string{})); !listing.EnvVar || listing.cdi() {
		t.Fatalf("%+v", listing)
	}
}

func TestListingsTheRealPluginRefusesAreRefused(t *testing.T) {
	for name, change := range map[string]map[string]string{
		"an unknown strategy":           {"DEVICE_LIST_STRATEGY": "cdi"},
		"volume mounts (not modelled)":  {"DEVICE_LIST_STRATEGY": "volume-mounts"},
		"CDI with no driver-ready file": {"DRIVER_ROOT_CTR_PATH": ""},
		"a prefix that is no prefix":    {"CDI_ANNOTATION_PREFIX": "cdi.k8s.io"},
	} {
		env := operatorEnv("/host")
		for k, v := range change {
			env[k] = v
		}
		if _, err := listingFrom(from(env)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestTheCDISpecHasEveryAdvertisedDeviceByUUID(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755)
	os.WriteFile(filepath.Join(root, "usr/bin/nvidia-smi"), []byte("#!/bin/sh\n"), 0o755)
	listing, _ := listingFrom(from(operatorEnv(root)))
	listing.CDIDir = t.TempDir()
	resources := map[string][]Device{
		"nvidia.com/gpu":         {{ID: "GPU-a::0", Underlying: "GPU-a"}, {ID: "GPU-a::1", Underlying: "GPU-a"}},
		"nvidia.com/mig-1g.10gb": {{ID: "MIG-b", Underlying: "MIG-b"}},
	}
	spec, err := cdiSpec(listing, resources)
	if err != nil {
		t.Fatal(err)
	}
	path, err := writeCDISpec(listing.CDIDir, spec)
	if err != nil || filepath.Base(path) != "k8s.device-plugin.nvidia.com-gpu.yaml" {
		t.Fatal(path, err)
	}
	var written cdispec.Spec
	data, _ := os.ReadFile(path)
	if err := yaml.Unmarshal(data, &written); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range written.Devices {
		names = append(names, d.Name)
	}
	if written.Kind != cdiKind || strings.Join(names, ",") != "GPU-a,MIG-b" ||
		written.ContainerEdits.Mounts[0].HostPath != "/usr/bin/nvidia-smi" {
		t.Fatalf("%s", data)
	}
	// No driver at the root: no spec, as the real plugin fails without NVML.
	listing.DriverRootCtrPath = t.TempDir()
	if _, err := cdiSpec(listing, resources); err == nil {
		t.Fatal("a spec with no driver")
	}
}

func TestACDIAllocationNamesTheDevicesAndSetsNoEnv(t *testing.T) {
	listing, _ := listingFrom(from(operatorEnv("/host")))
	p := &plugin{name: "nvidia.com/gpu", listing: listing,
		devices: []Device{{ID: "GPU-a::0", Underlying: "GPU-a"}, {ID: "GPU-b::0", Underlying: "GPU-b"}}}
	response, err := p.Allocate(context.Background(), &api.AllocateRequest{ContainerRequests: []*api.ContainerAllocateRequest{
		{DevicesIds: []string{"GPU-a::0", "GPU-b::0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	got := response.ContainerResponses[0]
	if len(got.Envs) != 0 || len(got.CdiDevices) != 2 || got.CdiDevices[1].Name != "k8s.device-plugin.nvidia.com/gpu=GPU-b" {
		t.Fatalf("%+v", got)
	}
	if len(got.Annotations) != 1 {
		t.Fatalf("%+v", got.Annotations)
	}
	for key, value := range got.Annotations {
		if !strings.HasPrefix(key, "cdi.k8s.io/nvidia-device-plugin_") ||
			value != "k8s.device-plugin.nvidia.com/gpu=GPU-a,k8s.device-plugin.nvidia.com/gpu=GPU-b" {
			t.Fatal(key, value)
		}
	}
}
