package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// The env the GPU Operator v26.7 gives the toolkit container in NRI plugin mode, plus what the
// entrypoint sources from the validator's driver-ready file for a host driver.
func operatorEnv(ctrRoot string) map[string]string {
	return map[string]string{
		"ROOT": "/usr/local/nvidia", "NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND": "management.nvidia.com/gpu",
		"NVIDIA_VISIBLE_DEVICES": "void", "TOOLKIT_PID_FILE": "/run/nvidia/toolkit/toolkit.pid",
		"NRI_NAMESPACE": "gpu-operator", "CDI_ENABLED": "true", "NVIDIA_RUNTIME_SET_AS_DEFAULT": "false",
		"NVIDIA_CONTAINER_RUNTIME_MODE": "cdi", "CRIO_CONFIG_MODE": "config", "ENABLE_NRI_PLUGIN": "true",
		"NRI_SOCKET":     "/runtime/nri-sock-dir/nri.sock",
		"IS_HOST_DRIVER": "true", "NVIDIA_DRIVER_ROOT": "/", "DRIVER_ROOT_CTR_PATH": ctrRoot,
		"NVIDIA_DEV_ROOT": "/", "DEV_ROOT_CTR_PATH": ctrRoot,
	}
}

func lookup(env map[string]string) func(string) string {
	return func(key string) string { return env[key] }
}

func TestTheOperatorsEnvIsAccepted(t *testing.T) {
	cfg, err := configFrom(lookup(operatorEnv("/host")))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NRISocket != "/runtime/nri-sock-dir/nri.sock" || cfg.NRIPluginIndex != "10" || cfg.CDIKind != "management.nvidia.com/gpu" ||
		cfg.DriverRoot != "/" || cfg.DriverRootCtrPath != "/host" || cfg.CDIOutputDir != "/var/run/cdi" ||
		strings.Join(cfg.NRINamespaces, ",") != "gpu-operator" {
		t.Fatalf("%+v", cfg)
	}
}

func TestWhatTheRealToolkitWouldRefuseIsRefused(t *testing.T) {
	for name, change := range map[string]map[string]string{
		"CDI off":                         {"CDI_ENABLED": "false"},
		"not the NRI plugin mode":         {"ENABLE_NRI_PLUGIN": ""},
		"a runtime mode other than cdi":   {"NVIDIA_CONTAINER_RUNTIME_MODE": "legacy"},
		"nvidia as the default runtime":   {"NVIDIA_RUNTIME_SET_AS_DEFAULT": "true"},
		"a plugin index past 99":          {"NRI_PLUGIN_INDEX": "100"},
		"a plugin index not a number":     {"NRI_PLUGIN_INDEX": "ten"},
		"no namespace":                    {"NRI_NAMESPACE": ""},
		"no driver-ready file sourced":    {"NVIDIA_DRIVER_ROOT": ""},
		"a relative driver root":          {"DRIVER_ROOT_CTR_PATH": "host"},
		"a kind that is not vendor/class": {"CDI_KIND": "gpu"},
	} {
		env := operatorEnv("/host")
		for key, value := range change {
			env[key] = value
		}
		if _, err := configFrom(lookup(env)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestTheSocketMustBeThere(t *testing.T) {
	if err := checkSocket(filepath.Join(t.TempDir(), "nri.sock")); err == nil || !strings.Contains(err.Error(), "nri socket") {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "plain")
	os.WriteFile(file, nil, 0o644)
	if err := checkSocket(file); err == nil {
		t.Fatal("a plain file passed as the NRI socket")
	}
}

func hostWithSMI(t *testing.T, mode os.FileMode) string {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755)
	if err := os.WriteFile(filepath.Join(root, "usr/bin/nvidia-smi"), []byte("#!/bin/sh\n"), mode); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "run/gpuboot-double"), 0o755)
	os.WriteFile(filepath.Join(root, "run/gpuboot-double/gpus.json"), []byte(`{"gpus": []}`), 0o644)
	return root
}

func TestTheManagementSpecMountsTheHostsDriverFromItsRoot(t *testing.T) {
	cfg, _ := configFrom(lookup(operatorEnv(hostWithSMI(t, 0o755))))
	spec, err := managementSpec(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.CDIOutputDir = t.TempDir()
	path, err := writeSpec(cfg.CDIOutputDir, spec)
	if err != nil || filepath.Base(path) != "management.nvidia.com-gpu.yaml" {
		t.Fatal(path, err)
	}
	var written cdispec.Spec
	data, _ := os.ReadFile(path)
	if err := yaml.Unmarshal(data, &written); err != nil {
		t.Fatal(err)
	}
	if written.Kind != "management.nvidia.com/gpu" || len(written.Devices) != 1 || written.Devices[0].Name != "all" {
		t.Fatalf("%s", data)
	}
	mounts := written.Devices[0].ContainerEdits.Mounts
	// The host's path (the driver root on the host), not the path this container sees it at.
	if len(mounts) != 2 || mounts[0].HostPath != "/usr/bin/nvidia-smi" || mounts[0].ContainerPath != "/usr/bin/nvidia-smi" ||
		mounts[1].ContainerPath != "/run/gpuboot-double/gpus.json" {
		t.Fatalf("%+v", mounts)
	}
}

func TestNoDriverAtTheRootNoSpec(t *testing.T) {
	cfg, _ := configFrom(lookup(operatorEnv(t.TempDir())))
	if _, err := managementSpec(cfg); err == nil || !strings.Contains(err.Error(), "no driver") {
		t.Fatal(err)
	}
	cfg, _ = configFrom(lookup(operatorEnv(hostWithSMI(t, 0o644))))
	if _, err := managementSpec(cfg); err == nil {
		t.Fatal("a nvidia-smi that cannot run made a spec")
	}
}

func pod(namespace string, annotations map[string]string) *api.PodSandbox {
	return &api.PodSandbox{Name: "p", Namespace: namespace, Annotations: annotations}
}

func TestContainersGetTheirAnnotatedDevices(t *testing.T) {
	i := &injector{namespaces: []string{"gpu-operator"}, managementKind: "management.nvidia.com/gpu"}
	annotated := map[string]string{"nvidia.cdi.k8s.io/container.toolkit-validation": "management.nvidia.com/gpu=all"}
	adjust, _, err := i.CreateContainer(nil, pod("gpu-operator", annotated), &api.Container{Name: "toolkit-validation"})
	if err != nil || len(adjust.GetCDIDevices()) != 1 || adjust.GetCDIDevices()[0].GetName() != "management.nvidia.com/gpu=all" {
		t.Fatal(adjust, err)
	}
	// Another container of the same pod is not annotated.
	adjust, _, _ = i.CreateContainer(nil, pod("gpu-operator", annotated), &api.Container{Name: "driver-validation"})
	if len(adjust.GetCDIDevices()) != 0 {
		t.Fatal(adjust)
	}
	// A pod-scoped annotation covers every container.
	got, _ := i.devices(pod("team-a", map[string]string{"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=0,nvidia.com/gpu=1"}), "c")
	if strings.Join(got, " ") != "nvidia.com/gpu=0 nvidia.com/gpu=1" {
		t.Fatal(got)
	}
}

func TestManagementDevicesOnlyInTheAllowedNamespaces(t *testing.T) {
	i := &injector{namespaces: []string{"gpu-operator"}, managementKind: "management.nvidia.com/gpu"}
	got, err := i.devices(pod("team-a", map[string]string{"nvidia.cdi.k8s.io/container.c": "management.nvidia.com/gpu=all"}), "c")
	if err != nil || len(got) != 0 {
		t.Fatal(got, err)
	}
}

func TestAMalformedDeviceNameFailsTheContainer(t *testing.T) {
	i := &injector{namespaces: []string{"gpu-operator"}, managementKind: "management.nvidia.com/gpu"}
	for _, value := range []string{"all", "management.nvidia.com/gpu", "gpu=all", "management.nvidia.com/gpu="} {
		if _, err := i.devices(pod("gpu-operator", map[string]string{"nvidia.cdi.k8s.io/container.c": value}), "c"); err == nil {
			t.Errorf("%q accepted", value)
		}
	}
}
