package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// The CDI kind the real plugin names its devices with (its vendor, class gpu).
const cdiKind = "k8s.device-plugin.nvidia.com/gpu"

// Listing is how an allocation reaches the container, as the real plugin's
// --device-list-strategy (DEVICE_LIST_STRATEGY) says: an env var for the NVIDIA runtime, CDI
// annotations, or CDI devices in the CRI's field (the GPU Operator with CDI on sets
// "cdi-annotations,cdi-cri"). With a CDI strategy the plugin writes the CDI spec of its
// devices, from the driver root the validator found (sourced from driver-ready).
type Listing struct {
	EnvVar, CDIAnnotations, CDICRI bool
	AnnotationPrefix               string
	DriverRoot, DriverRootCtrPath  string
	CDIDir                         string
}

func (l Listing) cdi() bool { return l.CDIAnnotations || l.CDICRI }

// listingFrom reads the environment as the real plugin reads its flags.
func listingFrom(getenv func(string) string) (Listing, error) {
	listing := Listing{AnnotationPrefix: "cdi.k8s.io/", CDIDir: "/var/run/cdi"}
	if prefix := getenv("CDI_ANNOTATION_PREFIX"); prefix != "" {
		if !strings.HasSuffix(prefix, "/") {
			return Listing{}, fmt.Errorf("CDI_ANNOTATION_PREFIX %q: an annotation prefix ends in /", prefix)
		}
		listing.AnnotationPrefix = prefix
	}
	strategies := getenv("DEVICE_LIST_STRATEGY")
	if strategies == "" {
		strategies = "envvar"
	}
	for _, strategy := range strings.Split(strategies, ",") {
		switch strings.TrimSpace(strategy) {
		case "envvar":
			listing.EnvVar = true
		case "cdi-annotations":
			listing.CDIAnnotations = true
		case "cdi-cri":
			listing.CDICRI = true
		case "volume-mounts":
			return Listing{}, fmt.Errorf("DEVICE_LIST_STRATEGY volume-mounts: the double does not model it (the " +
				"NVIDIA runtime reads the mounts, and gpuboot's nodes have no NVIDIA runtime)")
		default:
			return Listing{}, fmt.Errorf("invalid strategy: %q (one of envvar, volume-mounts, cdi-annotations, cdi-cri)", strategy)
		}
	}
	if listing.cdi() {
		listing.DriverRoot, listing.DriverRootCtrPath = getenv("NVIDIA_DRIVER_ROOT"), getenv("DRIVER_ROOT_CTR_PATH")
		if !filepath.IsAbs(listing.DriverRoot) || !filepath.IsAbs(listing.DriverRootCtrPath) {
			return Listing{}, fmt.Errorf("a CDI strategy needs the driver root: NVIDIA_DRIVER_ROOT %q and DRIVER_ROOT_CTR_PATH %q "+
				"(the entrypoint sources them from the validator's driver-ready file)", listing.DriverRoot, listing.DriverRootCtrPath)
		}
	}
	return listing, nil
}

// hardwarePath: the node's double GPUs, read where NVML would find the driver: under the
// driver root as this container sees it.
func hardwarePath(getenv func(string) string) string {
	if path := getenv("GPUBOOT_DOUBLE_HARDWARE"); path != "" {
		return path
	}
	return filepath.Join(getenv("DRIVER_ROOT_CTR_PATH")+"/", "run/gpuboot-double/gpus.json")
}

// The driver's files a container with a GPU gets; a lab node's "driver" is its nvidia-smi double.
var driverBinaries = []string{"usr/bin/nvidia-smi"}

// cdiSpec: one CDI device per GPU or MIG device the resources advertise, by UUID (the
// operator's DEVICE_ID_STRATEGY uuid), each making the device visible, with the driver's files.
func cdiSpec(listing Listing, resources map[string][]Device) (*cdispec.Spec, error) {
	var mounts []*cdispec.Mount
	for _, binary := range driverBinaries {
		info, err := os.Stat(filepath.Join(listing.DriverRootCtrPath, binary))
		if err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
			return nil, fmt.Errorf("no driver at the driver root %s: %s is not an executable file", listing.DriverRoot, binary)
		}
		mounts = append(mounts, &cdispec.Mount{HostPath: filepath.Join(listing.DriverRoot, binary),
			ContainerPath: "/" + binary, Options: []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}})
	}
	seen := map[string]bool{}
	for _, devices := range resources {
		for _, device := range devices {
			seen[device.Underlying] = true
		}
	}
	uuids := make([]string, 0, len(seen))
	for uuid := range seen {
		uuids = append(uuids, uuid)
	}
	sort.Strings(uuids)
	spec := &cdispec.Spec{Version: "0.5.0", Kind: cdiKind, ContainerEdits: cdispec.ContainerEdits{Mounts: mounts}}
	for _, uuid := range uuids {
		spec.Devices = append(spec.Devices, cdispec.Device{Name: uuid,
			ContainerEdits: cdispec.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=" + uuid}}})
	}
	return spec, nil
}

// writeCDISpec writes the spec where containerd reads CDI specs, whole or not at all.
func writeCDISpec(dir string, spec *cdispec.Spec) (string, error) {
	data, err := yaml.Marshal(spec)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, strings.ReplaceAll(spec.Kind, "/", "-")+".yaml")
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return "", err
	}
	return path, os.Rename(path+".tmp", path)
}

var responses atomic.Uint64

// responseID: what tells one allocation's annotation from another's (the real plugin: a UUID).
func responseID() string {
	return fmt.Sprintf("%x-%x", time.Now().UnixNano(), responses.Add(1))
}

// qualified: the CDI names of the devices with these UUIDs.
func qualified(uuids []string) []string {
	names := make([]string, len(uuids))
	for i, uuid := range uuids {
		names[i] = cdiKind + "=" + uuid
	}
	return names
}
