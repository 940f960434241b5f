package main

import (
	"context"
	"fmt"
	"log"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/plugin"
)

// annotationDomain is where the GPU Operator annotates the CDI devices a container gets
// (nvidia.cdi.k8s.io/container.<name>: management.nvidia.com/gpu=all).
const annotationDomain = "nvidia.cdi.k8s.io"

// injector answers containerd's CreateContainer with the container's annotated CDI devices;
// containerd resolves them from the CDI specs (the one this double wrote).
type injector struct {
	namespaces     []string
	managementKind string
}

func (i *injector) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	devices, err := i.devices(pod, ctr.GetName())
	if err != nil {
		return nil, nil, err
	}
	adjust := &api.ContainerAdjustment{}
	for _, name := range devices {
		adjust.AddCDIDevice(&api.CDIDevice{Name: name})
	}
	if len(devices) > 0 {
		log.Printf("%s/%s/%s: CDI devices %s", pod.GetNamespace(), pod.GetName(), ctr.GetName(), strings.Join(devices, ","))
	}
	return adjust, nil, nil
}

// devices: the container's annotated CDI device names. A management device outside the allowed
// namespaces is not given (as the real plugin skips it); a malformed name fails the container,
// as containerd would on resolving it.
func (i *injector) devices(pod *api.PodSandbox, container string) ([]string, error) {
	value, ok := plugin.GetEffectiveAnnotation(pod, annotationDomain, container)
	if !ok {
		return nil, nil
	}
	var names []string
	for _, name := range strings.Split(value, ",") {
		name = strings.TrimSpace(name)
		kind, device, found := strings.Cut(name, "=")
		if !found || device == "" || checkKind(kind) != nil {
			return nil, fmt.Errorf("%s/%s: annotation %s/container.%s: %q is not a CDI device name (vendor.example/class=device)",
				pod.GetNamespace(), pod.GetName(), annotationDomain, container, name)
		}
		names = append(names, name)
	}
	if slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, i.managementKind+"=") }) &&
		!slices.Contains(i.namespaces, pod.GetNamespace()) {
		log.Printf("%s/%s asks for management CDI devices outside %s: none given", pod.GetNamespace(), pod.GetName(),
			strings.Join(i.namespaces, ", "))
		return nil, nil
	}
	return names, nil
}
