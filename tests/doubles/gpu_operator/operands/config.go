// TEST DOUBLE of NVIDIA's k8s-device-plugin: its configuration file, as the real plugin reads
// it (api/config/v1 at v0.20.0): the same keys, the same refusals (an unknown version, a MIG
// strategy other than none/single/mixed, a shared resource without a name or with fewer than 2
// replicas, a device count below 1). Unknown keys are ignored, as the real plugin ignores them.
package main

import (
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

type Config struct {
	Version string  `json:"version"`
	Flags   Flags   `json:"flags,omitempty"`
	Sharing Sharing `json:"sharing,omitempty"`
}

type Flags struct {
	MigStrategy     *string `json:"migStrategy"`
	FailOnInitError *bool   `json:"failOnInitError"`
}

type Sharing struct {
	TimeSlicing *Replicated `json:"timeSlicing,omitempty"`
	MPS         *Replicated `json:"mps,omitempty"`
}

type Replicated struct {
	RenameByDefault            bool                 `json:"renameByDefault,omitempty"`
	FailRequestsGreaterThanOne *bool                `json:"failRequestsGreaterThanOne,omitempty"`
	Resources                  []ReplicatedResource `json:"resources,omitempty"`
}

type ReplicatedResource struct {
	Name     string      `json:"name"`
	Rename   string      `json:"rename,omitempty"`
	Devices  interface{} `json:"devices,omitempty"`
	Replicas int         `json:"replicas"`
}

const (
	resourcePrefix = "nvidia.com/"
	sharedSuffix   = ".shared"
)

// LoadConfig reads the file the GPU Operator's config manager leaves for the plugin; no file
// is the plugin's defaults (strategy none, no sharing).
func LoadConfig(path string) (*Config, error) {
	config := &Config{Version: "v1"}
	if path == "" {
		return config, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("error opening config file: %v", err)
	}
	if err := yaml.Unmarshal(data, config); err != nil {
		return nil, fmt.Errorf("error parsing config file: unmarshal error: %v", err)
	}
	if config.Version == "" {
		config.Version = "v1"
	}
	if config.Version != "v1" {
		return nil, fmt.Errorf("error parsing config file: unknown version: %v", config.Version)
	}
	if _, err := config.Strategy(); err != nil {
		return nil, err
	}
	for _, sharing := range []*Replicated{config.Sharing.TimeSlicing, config.Sharing.MPS} {
		if err := sharing.validate(); err != nil {
			return nil, fmt.Errorf("error parsing config file: %v", err)
		}
	}
	if config.Sharing.MPS != nil && len(config.Sharing.MPS.Resources) > 0 {
		return nil, fmt.Errorf("sharing.mps: this double serves time-slicing only; MPS needs its control daemon")
	}
	return config, nil
}

func (c *Config) Strategy() (string, error) {
	if c.Flags.MigStrategy == nil {
		return "none", nil
	}
	switch s := *c.Flags.MigStrategy; s {
	case "none", "single", "mixed":
		return s, nil
	default:
		return "", fmt.Errorf("invalid strategy: %v", s)
	}
}

func (r *Replicated) validate() error {
	if r == nil {
		return nil
	}
	if len(r.Resources) == 0 {
		return fmt.Errorf("no resources specified")
	}
	for _, resource := range r.Resources {
		if resource.Name == "" {
			return fmt.Errorf("no resource name specified")
		}
		if err := validName(resource.Name); err != nil {
			return err
		}
		if resource.Rename != "" {
			if err := validName(resource.Rename); err != nil {
				return err
			}
		}
		if resource.Replicas == 0 {
			return fmt.Errorf("no replicas specified")
		}
		if resource.Replicas < 2 {
			return fmt.Errorf("number of replicas must be >= 2")
		}
		if _, err := resource.count(); err != nil {
			return err
		}
	}
	return nil
}

// validName: a name as the config writes it (`gpu`, `mig-1g.10gb`, or with the nvidia.com/ prefix).
func validName(name string) error {
	bare := strings.TrimPrefix(name, resourcePrefix)
	if bare == "" || strings.ContainsAny(bare, "/ ") {
		return fmt.Errorf("incorrect format for resource name '%v'", name)
	}
	return nil
}

func fullName(name string) string {
	return resourcePrefix + strings.TrimPrefix(name, resourcePrefix)
}

// count: how many of the resource's devices are shared; 0 is all of them. A list of device
// indices or UUIDs is the real plugin's too, but no configuration gpuboot writes uses one.
func (r ReplicatedResource) count() (int, error) {
	switch devices := r.Devices.(type) {
	case nil:
		return 0, nil
	case string:
		if devices != "all" {
			return 0, fmt.Errorf("devices set as '%v' but the only valid string input is 'all'", devices)
		}
		return 0, nil
	case float64:
		if devices <= 0 {
			return 0, fmt.Errorf("devices set as '%v' but a count of devices must be > 0", devices)
		}
		return int(devices), nil
	default:
		return 0, fmt.Errorf("devices as a list: not served by this double (gpuboot writes 'all')")
	}
}
