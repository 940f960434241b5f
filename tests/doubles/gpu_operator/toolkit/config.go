package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Config is what the GPU Operator's toolkit DaemonSet gives the toolkit container (its env,
// with the driver-ready file the entrypoint sources), read as strictly as the real installer's
// flags: a value the real one would refuse is refused, and a mode this double does not model
// is refused with what it does model.
type Config struct {
	NRISocket         string
	NRIPluginIndex    string
	NRINamespaces     []string // where management CDI devices may go
	CDIOutputDir      string
	CDIKind           string
	DriverRoot        string // the driver's root on the host (NVIDIA_DRIVER_ROOT)
	DriverRootCtrPath string // the same root as this container sees it
	PIDFile           string
	ValidationsDir    string
}

func truthy(value string) bool {
	b, err := strconv.ParseBool(value)
	return err == nil && b
}

// configFrom reads the environment (as os.Getenv).
func configFrom(getenv func(string) string) (Config, error) {
	or := func(key, fallback string) string {
		if v := getenv(key); v != "" {
			return v
		}
		return fallback
	}
	if !truthy(getenv("CDI_ENABLED")) && !truthy(getenv("ENABLE_CDI")) {
		return Config{}, fmt.Errorf("CDI_ENABLED is not true: this double models the toolkit with CDI on " +
			"(the operator sets it when ClusterPolicy cdi.enabled is true)")
	}
	if !truthy(getenv("ENABLE_NRI_PLUGIN")) {
		return Config{}, fmt.Errorf("ENABLE_NRI_PLUGIN is not true: this double models the NRI plugin mode only " +
			"(ClusterPolicy cdi.nriPluginEnabled), in which the toolkit leaves the runtime's configuration alone")
	}
	if mode := getenv("NVIDIA_CONTAINER_RUNTIME_MODE"); mode != "cdi" {
		return Config{}, fmt.Errorf("NVIDIA_CONTAINER_RUNTIME_MODE is %q; with CDI on the operator sets \"cdi\"", mode)
	}
	if truthy(getenv("NVIDIA_RUNTIME_SET_AS_DEFAULT")) {
		return Config{}, fmt.Errorf("NVIDIA_RUNTIME_SET_AS_DEFAULT is true: in NRI plugin mode no runtime is configured")
	}
	index := or("NRI_PLUGIN_INDEX", "10")
	if n, err := strconv.ParseUint(index, 10, 32); err != nil || n > 99 {
		return Config{}, fmt.Errorf("NRI_PLUGIN_INDEX %q: nri-plugin-index must be in the range [0,99]", index)
	}
	namespace := getenv("NRI_NAMESPACE")
	if namespace == "" {
		return Config{}, fmt.Errorf("NRI_NAMESPACE is empty: the operator sets it to the toolkit pod's namespace, " +
			"the one namespace whose pods may get management CDI devices")
	}
	namespaces := []string{namespace}
	for _, extra := range strings.Split(getenv("NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES"), ",") {
		if extra = strings.TrimSpace(extra); extra != "" {
			namespaces = append(namespaces, extra)
		}
	}
	kind := or("CDI_KIND", "management.nvidia.com/gpu")
	if err := checkKind(kind); err != nil {
		return Config{}, fmt.Errorf("CDI_KIND: %w", err)
	}
	root, ctrRoot := getenv("NVIDIA_DRIVER_ROOT"), getenv("DRIVER_ROOT_CTR_PATH")
	if root == "" || ctrRoot == "" {
		return Config{}, fmt.Errorf("NVIDIA_DRIVER_ROOT and DRIVER_ROOT_CTR_PATH are not both set: the entrypoint " +
			"sources them from /run/nvidia/validations/driver-ready, which the validator writes once the driver is ready")
	}
	for key, path := range map[string]string{"NVIDIA_DRIVER_ROOT": root, "DRIVER_ROOT_CTR_PATH": ctrRoot} {
		if !filepath.IsAbs(path) {
			return Config{}, fmt.Errorf("%s %q is not an absolute path", key, path)
		}
	}
	return Config{
		NRISocket:         or("NRI_SOCKET", "/var/run/nri/nri.sock"),
		NRIPluginIndex:    index,
		NRINamespaces:     namespaces,
		CDIOutputDir:      or("CDI_OUTPUT_DIR", "/var/run/cdi"),
		CDIKind:           kind,
		DriverRoot:        filepath.Clean(root),
		DriverRootCtrPath: filepath.Clean(ctrRoot),
		PIDFile:           or("TOOLKIT_PID_FILE", "/run/nvidia/toolkit/toolkit.pid"),
		ValidationsDir:    "/run/nvidia/validations",
	}, nil
}

// checkKind: vendor/class, as CDI names a kind.
func checkKind(kind string) error {
	vendor, class, ok := strings.Cut(kind, "/")
	if !ok || vendor == "" || class == "" || strings.ContainsAny(class, "/=") || !strings.Contains(vendor, ".") {
		return fmt.Errorf("%q is not a CDI kind (vendor.example/class)", kind)
	}
	return nil
}

// checkSocket: the NRI socket must be there, as the real plugin stats it before dialling.
func checkSocket(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("failed to find valid nri socket at %s: %w (is NRI enabled in containerd?)", path, err)
	}
	if info.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s is not a socket", path)
	}
	return nil
}
