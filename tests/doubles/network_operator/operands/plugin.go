package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os/signal"
	"syscall"

	"gpuboot.local/doubles/deviceplugin"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// pluginFlags are what both device plugin doubles take besides their own configuration: the
// real plugins' --use-cdi (not doubled) and the double's own flags.
type pluginFlags struct {
	double    string // how its log lines name it
	useCdi    *bool
	hardware  *string
	pluginDir *string
	once      *bool
}

func newPluginFlags(flags *flag.FlagSet, double, hardwareRoot string) pluginFlags {
	return pluginFlags{
		double:    double,
		useCdi:    flags.Bool("use-cdi", false, "Use Container Device Interface to expose devices in containers"),
		hardware:  flags.String("hardware", hardwareRoot, "the node's double sysfs tree (the double's own flag)"),
		pluginDir: flags.String("plugin-dir", api.DevicePluginPath, "the kubelet's device-plugin folder (the double's own flag)"),
		once:      flags.Bool("print", false, "print what it would advertise, and exit (the double's own flag)"),
	}
}

// refused says why the double cannot go on: what it does not double, else a load error.
func (f pluginFlags) refused(err error) bool {
	if *f.useCdi {
		log.Printf("%s TEST DOUBLE: --use-cdi is not doubled", f.double)
		return true
	}
	if err != nil {
		log.Printf("%s TEST DOUBLE: %v", f.double, err)
		return true
	}
	return false
}

// advertised is one resource a plugin double offers the kubelet, with its device count.
type advertised struct {
	deviceplugin.Resource
	devices int
}

// advertise prints the resources (--print) or serves them to the kubelet until stopped.
func (f pluginFlags) advertise(resources []advertised) int {
	if *f.once {
		for _, resource := range resources {
			fmt.Printf("%s=%d\n", resource.Name, resource.devices)
		}
		return 0
	}
	served := make([]deviceplugin.Resource, 0, len(resources))
	for _, resource := range resources {
		served = append(served, resource.Resource)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := deviceplugin.Serve(ctx, *f.pluginDir, served); err != nil {
		log.Printf("%s TEST DOUBLE: %v", f.double, err)
		return 1
	}
	return 0
}
