package main

// The RDMA shared device plugin (Mellanox/k8s-rdma-shared-dev-plugin, the image the
// NicClusterPolicy's rdmaSharedDevicePlugin names): its config as the real plugin reads and
// validates it, the network functions each resource's selectors take, and per resource
// rdmaHcaMax devices when any taken function has RDMA devices (none, and a warning, otherwise),
// registered with the kubelet. An allocation gets the RDMA character devices under
// /dev/infiniband that exist (the lab's nodes have none: a container asking is given none).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	"google.golang.org/grpc"
	"gpuboot.local/doubles/deviceplugin"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The real plugin's defaults (pkg/resources).
const (
	rdmaConfigFile        = "/k8s-rdma-shared-dev-plugin/config.json"
	rdmaResourcePrefix    = "rdma"
	rdmaSocketSuffix      = "sock"
	rdmaCharDevicesFolder = "/dev/infiniband"
)

var validResourceName = regexp.MustCompile(`^[a-zA-Z0-9_]+$`)

// Selectors, UserConfig, UserConfigList: the real plugin's config (pkg/types), read as it reads
// it (encoding/json).
type Selectors struct {
	Vendors   []string `json:"vendors,omitempty"`
	DeviceIDs []string `json:"deviceIDs,omitempty"`
	Drivers   []string `json:"drivers,omitempty"`
	IfNames   []string `json:"ifNames,omitempty"`
	LinkTypes []string `json:"linkTypes,omitempty"`
}

type UserConfig struct {
	ResourceName   string    `json:"resourceName"`
	ResourcePrefix string    `json:"resourcePrefix"`
	RdmaHcaMax     int       `json:"rdmaHcaMax"`
	Devices        []string  `json:"devices"`
	Selectors      Selectors `json:"selectors"`
}

type UserConfigList struct {
	PeriodicUpdateInterval *int         `json:"periodicUpdateInterval"`
	ConfigList             []UserConfig `json:"configList"`
}

func (s Selectors) empty() bool {
	return len(s.Vendors)+len(s.DeviceIDs)+len(s.Drivers)+len(s.IfNames)+len(s.LinkTypes) == 0
}

// LoadRdmaConfig reads and validates the config with the real plugin's rules and messages
// (ReadConfig, ValidateConfigs); the default prefix is filled in, and a config of `devices`
// becomes an ifNames selector.
func LoadRdmaConfig(path string) ([]UserConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("error reading device plugin config file: %v", err)
	}
	var list UserConfigList
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("error unmarshalling device plugin config: %v", err)
	}
	if list.PeriodicUpdateInterval != nil && *list.PeriodicUpdateInterval < 0 {
		return nil, fmt.Errorf("invalid \"periodicUpdateInterval\" configuration \"%d\"", *list.PeriodicUpdateInterval)
	}
	if len(list.ConfigList) < 1 {
		return nil, fmt.Errorf("no resources configuration found")
	}
	seen := map[string]bool{}
	for i := range list.ConfigList {
		conf := &list.ConfigList[i]
		if !validResourceName.MatchString(conf.ResourceName) {
			return nil, fmt.Errorf("error: resource name \"%s\" contains invalid characters", conf.ResourceName)
		}
		if seen[conf.ResourceName] {
			return nil, fmt.Errorf("error: resource name \"%s\" already exists", conf.ResourceName)
		}
		seen[conf.ResourceName] = true
		if conf.ResourcePrefix == "" {
			conf.ResourcePrefix = rdmaResourcePrefix
		}
		if conf.RdmaHcaMax < 0 {
			return nil, fmt.Errorf("error: Invalid value for rdmaHcaMax < 0: %d", conf.RdmaHcaMax)
		}
		switch {
		case conf.Selectors.empty() && len(conf.Devices) == 0:
			return nil, fmt.Errorf("error: configuration missmatch. neither \"selectors\" nor \"devices\" fields exits")
		case !conf.Selectors.empty() && len(conf.Devices) > 0:
			return nil, fmt.Errorf("configuration mismatch. Cannot specify both \"selectors\" and \"devices\" fields")
		case conf.Selectors.empty():
			conf.Selectors.IfNames = conf.Devices
		}
	}
	return list.ConfigList, nil
}

// Takes: the functions the selectors take, every set selector holding (GetFilteredDevices).
func Takes(ports []Port, s Selectors) []Port {
	var taken []Port
	for _, port := range ports {
		holds := func(wanted []string, value string) bool { return len(wanted) == 0 || slices.Contains(wanted, value) }
		if holds(s.Vendors, port.Vendor) && holds(s.DeviceIDs, port.DeviceID) && holds(s.Drivers, port.Driver) &&
			holds(s.IfNames, port.IfName) && holds(s.LinkTypes, port.LinkType) {
			taken = append(taken, port)
		}
	}
	return taken
}

// SharedResource: one resource of the config as the plugin serves it.
type SharedResource struct {
	Name    string // prefix/name
	Socket  string // name.sock
	Devices int    // rdmaHcaMax, or 0 where no taken function has RDMA devices
	Taken   []Port
}

// SharedResources: what the plugin serves for the config on this hardware.
func SharedResources(configs []UserConfig, ports []Port) []SharedResource {
	var out []SharedResource
	for _, conf := range configs {
		taken := Takes(ports, conf.Selectors)
		resource := SharedResource{Name: conf.ResourcePrefix + "/" + conf.ResourceName,
			Socket: conf.ResourceName + "." + rdmaSocketSuffix, Taken: taken}
		if slices.ContainsFunc(taken, func(p Port) bool { return len(p.RDMA) > 0 }) {
			resource.Devices = conf.RdmaHcaMax
		} else {
			log.Printf("Warning: no Rdma Devices were found for resource %s", conf.ResourceName)
		}
		out = append(out, resource)
	}
	return out
}

type sharedPlugin struct {
	deviceplugin.Defaults
	resource    SharedResource
	charDevices string // the folder whose character devices every container gets
}

func (p *sharedPlugin) ListAndWatch(_ *api.Empty, stream grpc.ServerStreamingServer[api.ListAndWatchResponse]) error {
	response := &api.ListAndWatchResponse{}
	for n := 0; n < p.resource.Devices; n++ {
		response.Devices = append(response.Devices, &api.Device{ID: strconv.Itoa(n), Health: api.Healthy})
	}
	if err := stream.Send(response); err != nil {
		return err
	}
	<-stream.Context().Done() // the double's hardware never changes
	return nil
}

// Allocate: every container gets the RDMA character devices there are (the resource is
// shared: any of its IDs means the same devices).
func (p *sharedPlugin) Allocate(_ context.Context, request *api.AllocateRequest) (*api.AllocateResponse, error) {
	var specs []*api.DeviceSpec
	entries, _ := os.ReadDir(p.charDevices)
	for _, entry := range entries {
		if entry.Type()&os.ModeCharDevice != 0 {
			path := filepath.Join(rdmaCharDevicesFolder, entry.Name())
			specs = append(specs, &api.DeviceSpec{HostPath: path, ContainerPath: path, Permissions: "rw"})
		}
	}
	response := &api.AllocateResponse{}
	for range request.ContainerRequests {
		response.ContainerResponses = append(response.ContainerResponses, &api.ContainerAllocateResponse{Devices: specs})
	}
	return response, nil
}

func rdmaSharedMain(args []string) int {
	flags := flag.NewFlagSet("k8s-rdma-shared-dp", flag.ContinueOnError)
	configFile := flags.String("config-file", rdmaConfigFile, "path to device plugin config file")
	plugin := newPluginFlags(flags, "rdma shared device plugin", HardwareRoot)
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if plugin.refused(nil) {
		return 1
	}
	configs, err := LoadRdmaConfig(*configFile)
	if err != nil {
		log.Printf("Exiting.. one or more invalid configuration(s) given: %v", err)
		return 1
	}
	ports, err := Ports(*plugin.hardware)
	if plugin.refused(err) {
		return 1
	}
	var resources []advertised
	for _, resource := range SharedResources(configs, ports) {
		resources = append(resources, advertised{deviceplugin.Resource{Name: resource.Name, Endpoint: resource.Socket,
			Server: &sharedPlugin{resource: resource, charDevices: rdmaCharDevicesFolder}}, resource.Devices})
	}
	return plugin.advertise(resources)
}
