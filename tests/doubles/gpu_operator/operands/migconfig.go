package main

// The MIG manager double's view of a mig-parted configuration (NVIDIA/mig-parted v0.15.0,
// api/spec/v1 and pkg/types): the file the GPU Operator mounts at /mig-parted-config, read as
// strictly as the real one reads it (a version other than v1, an unknown field, an entry
// without `devices` or `mig-enabled`, `devices` neither "all" nor a list of indices, a profile
// not of the form <n>g.<m>gb[+attr], a negative count, or counts that are all 0 are refused),
// and applied to the node's double GPUs as mig-parted applies it through NVML: MIG mode on or
// off, then the listed MIG devices on each selected GPU. A layout a GPU cannot hold (more than
// its 7 compute slices or its memory) fails as NVML's create call would.

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

type MigParted struct {
	Version    string                     `json:"version"`
	MigConfigs map[string][]MigConfigSpec `json:"mig-configs"`
}

type MigConfigSpec struct {
	DeviceFilter []string       // PCI device ids (0x233010DE); none: every GPU
	AllDevices   bool           // devices: all
	Devices      []int          // devices: [0, 1]
	MigEnabled   bool           // mig-enabled
	MigDevices   map[string]int // mig-devices: {"1g.10gb": 7}
}

// The profile names mig-parted accepts: <compute slices>g.<memory>gb, with attributes after "+".
var migProfileFormat = regexp.MustCompile(`^([1-7])g\.([0-9]+)gb((\+[a-z]+(\.[a-z]+)?)*)$`)

const computeSlices = 7

func LoadMigParted(path string) (*MigParted, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseMigParted(data)
}

func ParseMigParted(data []byte) (*MigParted, error) {
	raw := map[string]json.RawMessage{}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, err
	}
	spec := &MigParted{MigConfigs: map[string][]MigConfigSpec{}}
	if err := unmarshalField(raw, "version", &spec.Version); err != nil || spec.Version != "v1" {
		return nil, fmt.Errorf("unknown version: %v", spec.Version)
	}
	for key, value := range raw {
		switch key {
		case "version":
		case "mig-configs":
			entries := map[string][]json.RawMessage{}
			if err := json.Unmarshal(value, &entries); err != nil {
				return nil, fmt.Errorf("mig-configs: %v", err)
			}
			if len(entries) == 0 {
				return nil, fmt.Errorf("at least one entry in 'mig-configs' is required")
			}
			for name, list := range entries {
				if len(list) == 0 {
					return nil, fmt.Errorf("at least one entry in '%v' is required", name)
				}
				for i, item := range list {
					entry, err := parseMigConfigSpec(item)
					if err != nil {
						return nil, fmt.Errorf("mig-configs.%s[%d]: %v", name, i, err)
					}
					spec.MigConfigs[name] = append(spec.MigConfigs[name], entry)
				}
			}
		default:
			return nil, fmt.Errorf("unexpected field: %v", key)
		}
	}
	return spec, nil
}

func unmarshalField(raw map[string]json.RawMessage, key string, into any) error {
	value, ok := raw[key]
	if !ok {
		return fmt.Errorf("missing required field: %v", key)
	}
	return json.Unmarshal(value, into)
}

func parseMigConfigSpec(data json.RawMessage) (MigConfigSpec, error) {
	raw := map[string]json.RawMessage{}
	if err := json.Unmarshal(data, &raw); err != nil {
		return MigConfigSpec{}, err
	}
	entry := MigConfigSpec{}
	for _, required := range []string{"devices", "mig-enabled"} {
		if _, ok := raw[required]; !ok {
			return MigConfigSpec{}, fmt.Errorf("missing required field: %v", required)
		}
	}
	for key, value := range raw {
		switch key {
		case "device-filter":
			var one string
			if json.Unmarshal(value, &one) == nil {
				entry.DeviceFilter = []string{one}
			} else if err := json.Unmarshal(value, &entry.DeviceFilter); err != nil {
				return MigConfigSpec{}, fmt.Errorf("device-filter: %v", err)
			}
		case "devices":
			var all string
			if json.Unmarshal(value, &all) == nil {
				if all != "all" {
					return MigConfigSpec{}, fmt.Errorf("invalid string input for 'devices': %v", all)
				}
				entry.AllDevices = true
			} else if err := json.Unmarshal(value, &entry.Devices); err != nil {
				return MigConfigSpec{}, fmt.Errorf("devices: %v", err)
			}
		case "mig-enabled":
			if err := json.Unmarshal(value, &entry.MigEnabled); err != nil {
				return MigConfigSpec{}, fmt.Errorf("mig-enabled: %v", err)
			}
		case "mig-devices":
			if err := json.Unmarshal(value, &entry.MigDevices); err != nil {
				return MigConfigSpec{}, fmt.Errorf("mig-devices: %v", err)
			}
			if err := assertValidMigDevices(entry.MigDevices); err != nil {
				return MigConfigSpec{}, err
			}
		default:
			return MigConfigSpec{}, fmt.Errorf("unexpected field: %v", key)
		}
	}
	if !entry.MigEnabled && len(entry.MigDevices) > 0 {
		return MigConfigSpec{}, fmt.Errorf("mig-devices given with mig-enabled false")
	}
	return entry, nil
}

// assertValidMigDevices: types.MigConfig.AssertValidFormat.
func assertValidMigDevices(devices map[string]int) error {
	if len(devices) == 0 {
		return nil
	}
	positive := false
	for profile, count := range devices {
		if !migProfileFormat.MatchString(profile) {
			return fmt.Errorf("invalid format for '%v': not <n>g.<m>gb", profile)
		}
		if count < 0 {
			return fmt.Errorf("invalid count for '%v': %v", profile, count)
		}
		positive = positive || count > 0
	}
	if !positive {
		return fmt.Errorf("all counts for all MigProfiles are 0")
	}
	return nil
}

// selects: whether an entry applies to this GPU.
func (e MigConfigSpec) selects(gpu GPU) (bool, error) {
	if len(e.DeviceFilter) > 0 {
		if gpu.PCIDeviceID == "" {
			return false, fmt.Errorf("GPU %d has no PCI device id in the double's hardware file to match device-filter %v",
				gpu.Index, e.DeviceFilter)
		}
		matched := false
		for _, id := range e.DeviceFilter {
			matched = matched || strings.EqualFold(id, gpu.PCIDeviceID)
		}
		if !matched {
			return false, nil
		}
	}
	if e.AllDevices {
		return true, nil
	}
	for _, index := range e.Devices {
		if index == gpu.Index {
			return true, nil
		}
	}
	return false, nil
}

// Layout: what a config asks of each GPU it selects, by index.
func (m *MigParted) Layout(name string, hardware *Hardware) (map[int]MigConfigSpec, error) {
	entries, ok := m.MigConfigs[name]
	if !ok {
		names := make([]string, 0, len(m.MigConfigs))
		for known := range m.MigConfigs {
			names = append(names, known)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("config %q not present in the configuration file (it has %v)", name, names)
	}
	layout := map[int]MigConfigSpec{}
	for _, entry := range entries {
		for _, index := range entry.Devices {
			if index < 0 || index >= len(hardware.GPUs) {
				return nil, fmt.Errorf("config %q names GPU %d; the node has %d", name, index, len(hardware.GPUs))
			}
		}
		for _, gpu := range hardware.GPUs {
			selected, err := entry.selects(gpu)
			if err != nil {
				return nil, err
			}
			if !selected {
				continue
			}
			if _, twice := layout[gpu.Index]; twice {
				return nil, fmt.Errorf("config %q selects GPU %d in two entries", name, gpu.Index)
			}
			if entry.MigEnabled && !gpu.MIGCapable {
				return nil, fmt.Errorf("config %q enables MIG on GPU %d (%s), which does not support MIG", name, gpu.Index, gpu.Product)
			}
			if err := fits(gpu, entry.MigDevices); err != nil {
				return nil, fmt.Errorf("config %q on GPU %d: %v", name, gpu.Index, err)
			}
			layout[gpu.Index] = entry
		}
	}
	return layout, nil
}

// fits: whether the GPU holds these MIG devices (its compute slices, its memory).
func fits(gpu GPU, devices map[string]int) error {
	slices, memoryGB := 0, 0
	for profile, count := range devices {
		parts := migProfileFormat.FindStringSubmatch(profile)
		compute, _ := strconv.Atoi(parts[1])
		memory, _ := strconv.Atoi(parts[2])
		slices += compute * count
		memoryGB += memory * count
	}
	if slices > computeSlices {
		return fmt.Errorf("%v needs %d compute slices; a GPU has %d", devices, slices, computeSlices)
	}
	if gpu.MemoryMiB > 0 && memoryGB*1000 > gpu.MemoryMiB {
		return fmt.Errorf("%v needs %d GB; the GPU has %d MiB", devices, memoryGB, gpu.MemoryMiB)
	}
	return nil
}

// Applied: whether the hardware is as the layout asks (mig-parted assert; --mode-only: the mode alone).
func Applied(hardware *Hardware, layout map[int]MigConfigSpec, modeOnly bool) bool {
	for _, gpu := range hardware.GPUs {
		entry, ok := layout[gpu.Index]
		if !ok {
			continue
		}
		if gpu.migMode() != entry.MigEnabled {
			return false
		}
		if modeOnly {
			continue
		}
		have := map[string]int{}
		for _, device := range gpu.MIG {
			have[device.Profile]++
		}
		want := map[string]int{}
		for profile, count := range entry.MigDevices {
			if count > 0 {
				want[profile] = count
			}
		}
		if len(have) != len(want) {
			return false
		}
		for profile, count := range want {
			if have[profile] != count {
				return false
			}
		}
	}
	return true
}

// Apply: the hardware after mig-parted apply (the MIG devices, ordered as the profiles sort).
func Apply(hardware *Hardware, layout map[int]MigConfigSpec) *Hardware {
	out := &Hardware{GPUs: make([]GPU, len(hardware.GPUs))}
	for i, gpu := range hardware.GPUs {
		entry, ok := layout[gpu.Index]
		if ok {
			gpu.MIG, gpu.MIGEnabled = nil, entry.MigEnabled
			profiles := make([]string, 0, len(entry.MigDevices))
			for profile := range entry.MigDevices {
				profiles = append(profiles, profile)
			}
			sort.Strings(profiles)
			for _, profile := range profiles {
				for n := 0; n < entry.MigDevices[profile]; n++ {
					gpu.MIG = append(gpu.MIG, MIGDevice{Profile: profile,
						UUID: fmt.Sprintf("MIG-%08d-%04d-4000-8000-double000000", gpu.Index, len(gpu.MIG))})
				}
			}
		}
		out.GPUs[i] = gpu
	}
	return out
}

// WriteHardware replaces the node's hardware file whole, as the operands read it.
func WriteHardware(path string, hardware *Hardware) error {
	data, err := json.MarshalIndent(hardware, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
