package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// HardwareRoot: where a lab node keeps its double sysfs tree (tests/doubles/hardware) for the
// operand doubles. Under /dev because the RDMA shared device plugin's pod mounts the host's
// /dev and no other host folder the tree could be in.
const HardwareRoot = "/dev/gpuboot-double/sys"

// Port: a network function as the RDMA shared device plugin sees it (ghw's PCI device, its
// driver, its first netdev, the netdev's link type and the RDMA devices under it).
type Port struct {
	PCIAddress string
	Vendor     string // "15b3", as ghw gives it
	DeviceID   string // "1021"
	Driver     string
	IfName     string
	LinkType   string   // "infiniband" or "ether", netlink's encapsulation type
	RDMA       []string // mlx5_0
}

// ARPHRD types (include/uapi/linux/if_arp.h) as netlink names them.
var linkTypes = map[string]string{"1": "ether", "32": "infiniband"}

// Ports: every PCI network controller (class 0x02) of the tree, as the real plugin discovers
// them, in address order.
func Ports(sysRoot string) ([]Port, error) {
	devices := filepath.Join(sysRoot, "bus", "pci", "devices")
	entries, err := os.ReadDir(devices)
	if err != nil {
		return nil, fmt.Errorf("no double hardware: %v", err)
	}
	var ports []Port
	for _, entry := range entries {
		dir := filepath.Join(devices, entry.Name())
		if !strings.HasPrefix(attribute(dir, "class"), "0x02") {
			continue
		}
		port := Port{PCIAddress: entry.Name(), Vendor: strings.TrimPrefix(attribute(dir, "vendor"), "0x"),
			DeviceID: strings.TrimPrefix(attribute(dir, "device"), "0x"), RDMA: names(filepath.Join(dir, "infiniband"))}
		if target, err := os.Readlink(filepath.Join(dir, "driver")); err == nil {
			port.Driver = filepath.Base(target)
		}
		if netdevs := names(filepath.Join(dir, "net")); len(netdevs) > 0 {
			port.IfName = netdevs[0]
			port.LinkType = linkTypes[attribute(filepath.Join(sysRoot, "class", "net", port.IfName), "type")]
		}
		ports = append(ports, port)
	}
	return ports, nil
}

func attribute(dir, name string) string {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

func names(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var found []string
	for _, entry := range entries {
		found = append(found, entry.Name())
	}
	sort.Strings(found)
	return found
}
