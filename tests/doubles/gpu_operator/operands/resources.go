// TEST DOUBLE of NVIDIA's k8s-device-plugin: what it would advertise. The GPUs are the node's
// double hardware as NVML would report it (a JSON file the lab's driver double writes); the
// resources follow the plugin's rules for the MIG strategy and time-slicing of its config.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

type Hardware struct {
	GPUs []GPU `json:"gpus"`
}

type GPU struct {
	Index   int         `json:"index"`
	UUID    string      `json:"uuid"`
	Product string      `json:"product"`
	MIG     []MIGDevice `json:"mig,omitempty"` // MIG enabled with these instances
	// MIG mode on with no instance yet (the MIG manager has not applied a layout).
	MIGEnabled bool `json:"migEnabled,omitempty"`
	// What NVML says of the model beyond its name (GFD's labels): MIG support, the
	// architecture's family (hopper, ampere, ada-lovelace) and the memory in MiB.
	MIGCapable bool   `json:"migCapable,omitempty"`
	Family     string `json:"family,omitempty"`
	MemoryMiB  int    `json:"memoryMiB,omitempty"`
	// The PCI device and vendor id (0x233010DE), which a mig-parted device-filter matches.
	PCIDeviceID string `json:"pciDeviceId,omitempty"`
}

type MIGDevice struct {
	UUID    string `json:"uuid"`
	Profile string `json:"profile"` // 1g.10gb
}

func LoadHardware(path string) (*Hardware, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("no NVML here: the double's hardware file %v: %v", path, err)
	}
	hardware := &Hardware{}
	decoder := json.NewDecoder(strings.NewReader(string(data)))
	decoder.DisallowUnknownFields() // the lab writes this file: a typo there is the lab's bug
	if err := decoder.Decode(hardware); err != nil {
		return nil, fmt.Errorf("%v: %v", path, err)
	}
	for _, gpu := range hardware.GPUs {
		if !strings.HasPrefix(gpu.UUID, "GPU-") {
			return nil, fmt.Errorf("%v: GPU %d's uuid %q does not start with GPU-", path, gpu.Index, gpu.UUID)
		}
	}
	return hardware, nil
}

func (g GPU) migMode() bool { return g.MIGEnabled || len(g.MIG) > 0 }

// Device: one device the kubelet sees, and the GPU or MIG device behind it.
type Device struct {
	ID         string // what the kubelet allocates (`<uuid>::<n>` for a time-sliced replica)
	Underlying string // the GPU or MIG device's UUID
}

// Resources: resource name -> its devices, sorted by name.
func Resources(hardware *Hardware, config *Config) (map[string][]Device, error) {
	strategy, err := config.Strategy()
	if err != nil {
		return nil, err
	}
	plain := map[string][]Device{}
	add := func(name, uuid string) { plain[name] = append(plain[name], Device{ID: uuid, Underlying: uuid}) }
	switch strategy {
	case "none":
		for _, gpu := range hardware.GPUs {
			add(resourcePrefix+"gpu", gpu.UUID)
		}
	case "single":
		profiles := map[string]bool{}
		enabled := 0
		for _, gpu := range hardware.GPUs {
			if gpu.migMode() {
				enabled++
			}
			for _, mig := range gpu.MIG {
				profiles[mig.Profile] = true
			}
		}
		switch {
		case enabled == 0:
			for _, gpu := range hardware.GPUs {
				add(resourcePrefix+"gpu", gpu.UUID)
			}
		case enabled != len(hardware.GPUs):
			return nil, fmt.Errorf("invalid MIG configuration for the single strategy: MIG is on for %d of %d GPUs", enabled, len(hardware.GPUs))
		case len(profiles) != 1:
			return nil, fmt.Errorf("invalid MIG configuration for the single strategy: %d MIG profiles (%v), one allowed", len(profiles), keys(profiles))
		default:
			for _, gpu := range hardware.GPUs {
				for _, mig := range gpu.MIG {
					add(resourcePrefix+"gpu", mig.UUID)
				}
			}
		}
	case "mixed":
		for _, gpu := range hardware.GPUs {
			if !gpu.migMode() {
				add(resourcePrefix+"gpu", gpu.UUID)
			}
			for _, mig := range gpu.MIG {
				add(resourcePrefix+"mig-"+mig.Profile, mig.UUID)
			}
		}
	}
	return share(plain, config.Sharing.TimeSlicing)
}

// share: each shared resource's devices (all, or the first `devices`) as `replicas` devices
// each, under its name or its rename (name.shared with renameByDefault).
func share(plain map[string][]Device, sharing *Replicated) (map[string][]Device, error) {
	if sharing == nil {
		return plain, nil
	}
	out := map[string][]Device{}
	for name, devices := range plain {
		out[name] = devices
	}
	for _, resource := range sharing.Resources {
		name := fullName(resource.Name)
		devices, found := plain[name]
		if !found {
			continue // nothing of it on this node: the real plugin shares nothing either
		}
		count, _ := resource.count()
		if count > 0 && count < len(devices) {
			devices = devices[:count]
		}
		target := name
		if resource.Rename != "" {
			target = fullName(resource.Rename)
		} else if sharing.RenameByDefault {
			target = name + sharedSuffix
		}
		var replicas []Device
		for _, device := range devices {
			for n := 0; n < resource.Replicas; n++ {
				replicas = append(replicas, Device{ID: fmt.Sprintf("%s::%d", device.ID, n), Underlying: device.Underlying})
			}
		}
		if len(devices) == len(plain[name]) {
			delete(out, name)
		} else {
			out[name] = plain[name][len(devices):]
		}
		out[target] = append(out[target], replicas...)
	}
	return out, nil
}

func keys(set map[string]bool) []string {
	var out []string
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
