package main

// The SR-IOV network device plugin (sriovdp of k8snetworkplumbingwg/sriov-network-device-plugin,
// NVIDIA's build under the Network Operator's tag) as the SR-IOV operator deploys it: its config
// is the one the operator renders per node into the device-plugin-config ConfigMap
// (/etc/pcidp/<node>: resourceList, each a netDevice resource with its selectors), read and
// validated with the real plugin's rules and messages (cmd/sriovdp/manager.go). Each resource
// takes the network functions of the node's double tree that its selectors match, as the real
// netDevice provider filters them (a PF whose VFs are made is not a device; pfNames and
// rootDevices name a VF's PF; isRdma wants an RDMA device), and is registered with the kubelet
// as <prefix>/<name> with one device per function, named by its PCI address.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"gpuboot.local/doubles/deviceplugin"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Where the plugin's pod sees the node's double tree: it mounts no host folder the tree is in
// but the device-info folder, where the lab binds the tree (tests/doubles/hardware).
const sriovDPHardwareRoot = "/var/run/k8s.cni.cncf.io/devinfo/dp/gpuboot-double/sys"

// NetDeviceSelectors and ResourceConfig: the real plugin's types (pkg/types), the fields the
// operator renders.
type NetDeviceSelectors struct {
	Vendors      []string `json:"vendors,omitempty"`
	Devices      []string `json:"devices,omitempty"`
	Drivers      []string `json:"drivers,omitempty"`
	PciAddresses []string `json:"pciAddresses,omitempty"`
	PfNames      []string `json:"pfNames,omitempty"`
	RootDevices  []string `json:"rootDevices,omitempty"`
	LinkTypes    []string `json:"linkTypes,omitempty"`
	IsRdma       bool     `json:"isRdma,omitempty"`
	NeedVhostNet bool     `json:"needVhostNet,omitempty"`
	VdpaType     string   `json:"vdpaType,omitempty"`
}

type ResourceConfig struct {
	ResourcePrefix  string           `json:"resourcePrefix,omitempty"`
	ResourceName    string           `json:"resourceName"`
	DeviceType      string           `json:"deviceType,omitempty"`
	ExcludeTopology bool             `json:"excludeTopology,omitempty"`
	Selectors       *json.RawMessage `json:"selectors,omitempty"`
}

// SriovResource: a resource as the plugin serves it.
type SriovResource struct {
	Name      string // nvidia.com/ib_vf
	Socket    string
	Selectors []NetDeviceSelectors
	Devices   []string // PCI addresses
}

// LoadSriovConfig reads the operator's config for the node with the real plugin's checks and
// messages; the resources are named with prefix unless one names its own.
func LoadSriovConfig(path, prefix string) ([]SriovResource, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("error reading file %s, %v", path, err)
	}
	var list struct {
		ResourceList []ResourceConfig `json:"resourceList"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("error unmarshalling raw bytes %v please make sure the config is in json format", err)
	}
	seen := map[string]bool{}
	var resources []SriovResource
	for _, conf := range list.ResourceList {
		if conf.DeviceType == "" {
			conf.DeviceType = "netDevice"
		}
		if conf.DeviceType != "netDevice" {
			return nil, fmt.Errorf("unsupported deviceType:  \"%s\" (the double has netDevice only)", conf.DeviceType)
		}
		if !validResourceName.MatchString(conf.ResourceName) {
			return nil, fmt.Errorf("resource name \"%s\" contains invalid characters", conf.ResourceName)
		}
		if conf.ResourcePrefix != "" {
			prefix = conf.ResourcePrefix
		}
		name := prefix + "/" + conf.ResourceName
		if seen[name] {
			return nil, fmt.Errorf("resource name \"%s\" already exists", name)
		}
		seen[name] = true
		selectors, err := parseSelectors(conf.Selectors)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
		resources = append(resources, SriovResource{Name: name, Socket: conf.ResourceName + ".sock", Selectors: selectors})
	}
	return resources, nil
}

// parseSelectors: one selector object, as the operator writes it, or a list of them (the
// plugin's newer form); a function matching any of them is taken.
func parseSelectors(raw *json.RawMessage) ([]NetDeviceSelectors, error) {
	if raw == nil {
		return []NetDeviceSelectors{{}}, nil
	}
	var many []NetDeviceSelectors
	if err := json.Unmarshal(*raw, &many); err == nil {
		return many, nil
	}
	var one NetDeviceSelectors
	if err := json.Unmarshal(*raw, &one); err != nil {
		return nil, fmt.Errorf("error unmarshalling selectors: %v", err)
	}
	return []NetDeviceSelectors{one}, nil
}

// function: a network function with what the selectors read of it.
type function struct {
	Port
	PfName, RootDevice string
	VfID               int // -1 for a PF
}

// Functions: the tree's network functions the plugin can hand out, in address order.
func Functions(sysRoot string) ([]function, error) {
	ports, err := Ports(sysRoot)
	if err != nil {
		return nil, err
	}
	var found []function
	for _, port := range ports {
		dir := pciDir(sysRoot, port.PCIAddress)
		fn := function{Port: port, VfID: -1}
		if target, err := os.Readlink(filepath.Join(dir, "physfn")); err == nil {
			fn.RootDevice = filepath.Base(target)
			fn.PfName = firstName(filepath.Join(pciDir(sysRoot, fn.RootDevice), "net"))
			links, _ := filepath.Glob(filepath.Join(pciDir(sysRoot, fn.RootDevice), "virtfn*"))
			for _, link := range links {
				if to, _ := os.Readlink(link); filepath.Base(to) == port.PCIAddress {
					fn.VfID, _ = strconv.Atoi(strings.TrimPrefix(filepath.Base(link), "virtfn"))
				}
			}
		} else if number(attribute(dir, "sriov_numvfs")) > 0 {
			continue // a PF whose VFs are made is not handed out
		}
		found = append(found, fn)
	}
	return found, nil
}

func firstName(dir string) string {
	if found := names(dir); len(found) > 0 {
		return found[0]
	}
	return ""
}

// takes: whether a selector object takes the function (every list it has must hold it).
func (s NetDeviceSelectors) takes(fn function) bool {
	in := func(list []string, value string) bool { return len(list) == 0 || slices.Contains(list, value) }
	return in(s.Vendors, fn.Vendor) && in(s.Devices, fn.DeviceID) && in(s.Drivers, fn.Driver) &&
		in(s.PciAddresses, fn.PCIAddress) && in(s.RootDevices, fn.RootDevice) && in(s.LinkTypes, fn.LinkType) &&
		(len(s.PfNames) == 0 || pfNameTakes(s.PfNames, fn)) && (!s.IsRdma || len(fn.RDMA) > 0)
}

// pfNameTakes: "<pf>" or "<pf>#<first>-<last>" (a range of VF ids).
func pfNameTakes(pfNames []string, fn function) bool {
	for _, entry := range pfNames {
		name, ranges, hasRange := strings.Cut(entry, "#")
		if name != fn.PfName {
			continue
		}
		if !hasRange {
			return true
		}
		for _, part := range strings.Split(ranges, ",") {
			first, last, _ := strings.Cut(part, "-")
			low, err1 := strconv.Atoi(first)
			high, err2 := strconv.Atoi(last)
			if last == "" {
				high, err2 = low, err1
			}
			if err1 == nil && err2 == nil && fn.VfID >= low && fn.VfID <= high {
				return true
			}
		}
	}
	return false
}

// SriovResources: each configured resource with the functions its selectors take.
func SriovResources(resources []SriovResource, functions []function) []SriovResource {
	out := make([]SriovResource, 0, len(resources))
	for _, resource := range resources {
		resource.Devices = nil
		for _, fn := range functions {
			if slices.ContainsFunc(resource.Selectors, func(s NetDeviceSelectors) bool { return s.takes(fn) }) {
				resource.Devices = append(resource.Devices, fn.PCIAddress)
			}
		}
		out = append(out, resource)
	}
	return out
}

type sriovPlugin struct {
	deviceplugin.Defaults
	resource SriovResource
}

func (p *sriovPlugin) ListAndWatch(_ *api.Empty, stream grpc.ServerStreamingServer[api.ListAndWatchResponse]) error {
	response := &api.ListAndWatchResponse{}
	for _, address := range p.resource.Devices {
		response.Devices = append(response.Devices, &api.Device{ID: address, Health: api.Healthy})
	}
	if err := stream.Send(response); err != nil {
		return err
	}
	<-stream.Context().Done() // the double's VFs change only when the config daemon restarts the pod
	return nil
}

// Allocate: the real plugin's environment for each container (PCIDEVICE_<PREFIX>_<NAME>: the
// PCI addresses given), which the SR-IOV CNI reads.
func (p *sriovPlugin) Allocate(_ context.Context, request *api.AllocateRequest) (*api.AllocateResponse, error) {
	variable := "PCIDEVICE_" + strings.ToUpper(strings.NewReplacer(".", "_", "/", "_").Replace(p.resource.Name))
	response := &api.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		for _, id := range container.DevicesIds {
			if !slices.Contains(p.resource.Devices, id) {
				return nil, fmt.Errorf("%s: no device %s", p.resource.Name, id)
			}
		}
		response.ContainerResponses = append(response.ContainerResponses, &api.ContainerAllocateResponse{
			Envs: map[string]string{variable: strings.Join(container.DevicesIds, ",")}})
	}
	return response, nil
}

func sriovDPMain(args []string) int {
	flags := flag.NewFlagSet("sriovdp", flag.ContinueOnError)
	configFile := flags.String("config-file", "/etc/pcidp/config.json", "JSON device pool config file location")
	prefix := flags.String("resource-prefix", "intel.com", "resource name prefix used for K8s extended resource")
	flags.Int("log-level", 2, "the real plugin's log level (the double logs the same either way)")
	plugin := newPluginFlags(flags, "sriov device plugin", sriovDPHardwareRoot)
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if plugin.refused(nil) {
		return 1
	}
	configured, err := LoadSriovConfig(*configFile, *prefix)
	if err != nil {
		log.Printf("Exiting.. one or more invalid configuration(s) given: %v", err)
		return 1
	}
	functions, err := Functions(*plugin.hardware)
	if plugin.refused(err) {
		return 1
	}
	var resources []advertised
	for _, resource := range SriovResources(configured, functions) {
		log.Printf("%s: %d device(s) %s", resource.Name, len(resource.Devices), strings.Join(resource.Devices, " "))
		resources = append(resources, advertised{deviceplugin.Resource{Name: resource.Name, Endpoint: resource.Socket,
			Server: &sriovPlugin{resource: resource}}, len(resource.Devices)})
	}
	return plugin.advertise(resources)
}
