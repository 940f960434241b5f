package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// The driver's files a management container gets. On a real node these are the driver's
// libraries (NVML among them), binaries and device nodes; a lab node's "preinstalled driver"
// is its nvidia-smi double and the file that stands for what NVML reports (the double GPUs the
// operand doubles read), so those are what there is to give.
var driverFiles = []struct {
	path       string
	executable bool
}{{"usr/bin/nvidia-smi", true}, {"run/gpuboot-double/gpus.json", false}}

// managementSpec is the CDI spec the real toolkit writes for management containers (the
// operator's validators and operands): one device, "all", with the driver's files mounted
// from the driver root on the host.
func managementSpec(cfg Config) (*cdispec.Spec, error) {
	var mounts []*cdispec.Mount
	for _, file := range driverFiles {
		seen := filepath.Join(cfg.DriverRootCtrPath, file.path)
		info, err := os.Stat(seen)
		if err != nil {
			return nil, fmt.Errorf("no driver at the driver root: %w (the validator said the driver is ready "+
				"at NVIDIA_DRIVER_ROOT=%s)", err, cfg.DriverRoot)
		}
		if !info.Mode().IsRegular() || (file.executable && info.Mode().Perm()&0o111 == 0) {
			return nil, fmt.Errorf("%s is not a file the driver's would be", seen)
		}
		mounts = append(mounts, &cdispec.Mount{
			HostPath:      filepath.Join(cfg.DriverRoot, file.path),
			ContainerPath: "/" + file.path,
			Options:       []string{"ro", "nosuid", "nodev", "rbind", "rprivate"},
		})
	}
	return &cdispec.Spec{
		Version: "0.5.0",
		Kind:    cfg.CDIKind,
		Devices: []cdispec.Device{{
			Name:           "all",
			ContainerEdits: cdispec.ContainerEdits{Mounts: mounts},
		}},
		ContainerEdits: cdispec.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}},
	}, nil
}

// specFileName: <vendor>-<class>.yaml, as CDI names a generated spec.
func specFileName(kind string) string {
	return strings.ReplaceAll(kind, "/", "-") + ".yaml"
}

// writeSpec writes the spec where containerd reads CDI specs, whole or not at all.
func writeSpec(dir string, spec *cdispec.Spec) (string, error) {
	data, err := yaml.Marshal(spec)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, specFileName(spec.Kind))
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}
