// TEST DOUBLES of the GPU Operator's operands that read the GPUs through NVML, for lab nodes that
// have no GPU: one binary that, as busybox does, is the operand it is run as (the name the
// image gives it): nvidia-device-plugin, gpu-feature-discovery (gfd.go), dcgm-exporter
// (dcgm.go) or nvidia-mig-manager (migmanager.go). Each reads the node's double GPUs from the
// file the lab's driver double writes, as the real one reads NVML through the driver.
//
// The device plugin (nvcr.io/nvidia/k8s-device-plugin's nvidia-device-plugin): it registers with the real kubelet through the device-plugin API
// (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1), one endpoint per resource as the real plugin
// does, and advertises the node's double GPUs, MIG devices and time-sliced replicas for its
// config, so that a node's allocatable comes from the kubelet. It registers again whenever
// the kubelet restarts (a new kubelet.sock), as the real plugin does. An allocation reaches the
// container as DEVICE_LIST_STRATEGY says: NVIDIA_VISIBLE_DEVICES, or with the GPU Operator's CDI
// strategies CDI devices (annotations and the CRI's field) from the CDI spec it writes, with
// the driver root the validator found.
//
// It is never part of gpuboot: the lab builds it into the images the GPU Operator deploys for
// these operands.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	"gpuboot.local/doubles/deviceplugin"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func main() {
	switch filepath.Base(os.Args[0]) {
	case "gpu-feature-discovery":
		gfdMain()
	case "dcgm-exporter":
		dcgmMain()
	case "nvidia-mig-manager":
		migManagerMain()
	default:
		devicePluginMain()
	}
}

func devicePluginMain() {
	configFile := flag.String("config-file", os.Getenv("CONFIG_FILE"), "the plugin's config (as the real plugin's --config-file)")
	hardwareFile := flag.String("hardware", hardwarePath(os.Getenv),
		"the node's double GPUs, as NVML would report them (default: under the driver root)")
	pluginDir := flag.String("plugin-dir", api.DevicePluginPath, "the kubelet's device-plugin folder")
	once := flag.Bool("print", false, "print the resources it would advertise, and exit")
	flag.Parse()

	resources, err := load(*configFile, *hardwareFile)
	if err != nil {
		log.Fatalf("device plugin double: %v", err)
	}
	listing, err := listingFrom(os.Getenv)
	if err != nil {
		log.Fatalf("device plugin double: %v", err)
	}
	if *once {
		for _, name := range sortedNames(resources) {
			fmt.Printf("%s=%d\n", name, len(resources[name]))
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if listing.cdi() {
		spec, err := cdiSpec(listing, resources)
		if err != nil {
			log.Fatalf("device plugin double: %v", err)
		}
		path, err := writeCDISpec(listing.CDIDir, spec)
		if err != nil {
			log.Fatalf("device plugin double: writing the CDI spec: %v", err)
		}
		log.Printf("CDI spec %s: %d devices", path, len(spec.Devices))
		defer os.Remove(path)
	}
	settings := Settings{StrictShare: failRequestsGreaterThanOne(*configFile), Listing: listing}
	if err := Serve(ctx, *pluginDir, resources, settings); err != nil {
		log.Fatalf("device plugin double: %v", err)
	}
}

func load(configFile, hardwareFile string) (map[string][]Device, error) {
	config, err := LoadConfig(configFile)
	if err != nil {
		return nil, err
	}
	hardware, err := LoadHardware(hardwareFile)
	if err != nil {
		return nil, err
	}
	return Resources(hardware, config)
}

func failRequestsGreaterThanOne(configFile string) bool {
	config, err := LoadConfig(configFile)
	if err != nil || config.Sharing.TimeSlicing == nil || config.Sharing.TimeSlicing.FailRequestsGreaterThanOne == nil {
		return false
	}
	return *config.Sharing.TimeSlicing.FailRequestsGreaterThanOne
}

func sortedNames(resources map[string][]Device) []string {
	var names []string
	for name := range resources {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// endpoint: the socket a resource is served on, in the kubelet's folder (nvidia-gpu.sock,
// nvidia-mig-1g.10gb.sock).
func endpoint(resource string) string {
	return "nvidia-" + strings.TrimPrefix(resource, resourcePrefix) + ".sock"
}

// Settings: how the plugin answers allocations.
type Settings struct {
	StrictShare bool // time-slicing's failRequestsGreaterThanOne
	Listing     Listing
}

// Serve registers every resource with the kubelet and serves it until ctx ends, registering
// again after each kubelet restart (tests/doubles/deviceplugin).
func Serve(ctx context.Context, dir string, resources map[string][]Device, settings Settings) error {
	var served []deviceplugin.Resource
	for _, name := range sortedNames(resources) {
		served = append(served, deviceplugin.Resource{Name: name, Endpoint: endpoint(name), Server: &plugin{
			name: name, devices: resources[name], strictShare: settings.StrictShare, listing: settings.Listing}})
		log.Printf("%s: %d devices", name, len(resources[name]))
	}
	return deviceplugin.Serve(ctx, dir, served)
}

type plugin struct {
	deviceplugin.Defaults
	name        string
	devices     []Device
	strictShare bool
	listing     Listing
}

func (p *plugin) ListAndWatch(_ *api.Empty, stream grpc.ServerStreamingServer[api.ListAndWatchResponse]) error {
	response := &api.ListAndWatchResponse{}
	for _, device := range p.devices {
		response.Devices = append(response.Devices, &api.Device{ID: device.ID, Health: api.Healthy})
	}
	if err := stream.Send(response); err != nil {
		return err
	}
	<-stream.Context().Done() // the double's devices never change
	return nil
}

func (p *plugin) Allocate(_ context.Context, request *api.AllocateRequest) (*api.AllocateResponse, error) {
	byID := map[string]Device{}
	for _, device := range p.devices {
		byID[device.ID] = device
	}
	response := &api.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		if p.strictShare && len(container.DevicesIds) > 1 {
			return nil, fmt.Errorf("request for '%v: %v' too large: maximum request size for shared resources is 1",
				p.name, len(container.DevicesIds))
		}
		var visible []string
		seen := map[string]bool{}
		for _, id := range container.DevicesIds {
			device, found := byID[id]
			if !found {
				return nil, fmt.Errorf("invalid allocation request for '%s': unknown device: %s", p.name, id)
			}
			if !seen[device.Underlying] {
				seen[device.Underlying] = true
				visible = append(visible, device.Underlying)
			}
		}
		response.ContainerResponses = append(response.ContainerResponses, p.listed(visible))
	}
	return response, nil
}

// listed: how the allocated devices reach the container, by the listing strategies. With only
// CDI strategies no env var is set, as the real plugin does.
func (p *plugin) listed(uuids []string) *api.ContainerAllocateResponse {
	response := &api.ContainerAllocateResponse{}
	if p.listing.CDIAnnotations {
		response.Annotations = map[string]string{
			p.listing.AnnotationPrefix + "nvidia-device-plugin_" + responseID(): strings.Join(qualified(uuids), ","),
		}
	}
	if p.listing.CDICRI {
		for _, name := range qualified(uuids) {
			response.CdiDevices = append(response.CdiDevices, &api.CDIDevice{Name: name})
		}
	}
	if p.listing.EnvVar || !p.listing.cdi() {
		response.Envs = map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(uuids, ",")}
	}
	return response
}
