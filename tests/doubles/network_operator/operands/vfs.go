package main

// The double sysfs tree's physical functions as the SR-IOV config daemon reports them
// (SriovNetworkNodeState status.interfaces, the fork's api/v1 InterfaceExt), and the VFs it
// makes in them: what the kernel shows once sriov_numvfs is written (virtfnN and physfn links,
// each VF's PCI function with its netdev and, on an RDMA port, its RDMA device).

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// vfDeviceID: the VF of a ConnectX-6 or -7 (the PF is 101d or 1021).
const vfDeviceID = "101e"

// VirtualFunction and InterfaceExt: the fork's api/v1 types, the fields the double fills.
type VirtualFunction struct {
	Name       string `json:"name,omitempty"`
	Driver     string `json:"driver,omitempty"`
	PciAddress string `json:"pciAddress"`
	Vendor     string `json:"vendor,omitempty"`
	DeviceID   string `json:"deviceID,omitempty"`
	Mtu        int    `json:"mtu,omitempty"`
	VfID       int    `json:"vfID"`
}

type InterfaceExt struct {
	Name           string            `json:"name,omitempty"`
	Mac            string            `json:"mac,omitempty"`
	Driver         string            `json:"driver,omitempty"`
	PciAddress     string            `json:"pciAddress"`
	Vendor         string            `json:"vendor,omitempty"`
	DeviceID       string            `json:"deviceID,omitempty"`
	Mtu            int               `json:"mtu,omitempty"`
	NumVfs         int               `json:"numVfs,omitempty"`
	LinkSpeed      string            `json:"linkSpeed,omitempty"`
	LinkType       string            `json:"linkType,omitempty"`
	LinkAdminState string            `json:"linkAdminState,omitempty"`
	EswitchMode    string            `json:"eSwitchMode,omitempty"`
	TotalVfs       int               `json:"totalvfs,omitempty"`
	VFs            []VirtualFunction `json:"Vfs,omitempty"`
}

// The daemon's names for netlink's link types.
var sriovLinkTypes = map[string]string{"ether": "ETH", "infiniband": "IB"}

// PhysicalFunctions: every Mellanox network function of the tree that is not a VF, in address
// order, with its VFs: the ports the daemon reports (its supported-NIC list holds ConnectX).
func PhysicalFunctions(sysRoot string) ([]InterfaceExt, error) {
	ports, err := Ports(sysRoot)
	if err != nil {
		return nil, err
	}
	var found []InterfaceExt
	for _, port := range ports {
		dir := pciDir(sysRoot, port.PCIAddress)
		if port.Vendor != "15b3" || exists(filepath.Join(dir, "physfn")) {
			continue
		}
		pf := InterfaceExt{Name: port.IfName, Driver: port.Driver, PciAddress: port.PCIAddress, Vendor: port.Vendor,
			DeviceID: port.DeviceID, LinkType: sriovLinkTypes[port.LinkType], LinkAdminState: "up",
			LinkSpeed: "400000 Mb/s", EswitchMode: "legacy", Mtu: mtu(port.LinkType),
			NumVfs: number(attribute(dir, "sriov_numvfs")), TotalVfs: number(attribute(dir, "sriov_totalvfs")),
			Mac: fmt.Sprintf("b8:3f:d2:%s", macTail(port.PCIAddress))}
		for id := 0; id < pf.NumVfs; id++ {
			target, err := os.Readlink(filepath.Join(dir, "virtfn"+strconv.Itoa(id)))
			if err != nil {
				return nil, fmt.Errorf("%s: sriov_numvfs is %d but virtfn%d is missing", port.PCIAddress, pf.NumVfs, id)
			}
			address := filepath.Base(target)
			vfDir := pciDir(sysRoot, address)
			vf := VirtualFunction{PciAddress: address, VfID: id, Mtu: pf.Mtu,
				Vendor:   strings.TrimPrefix(attribute(vfDir, "vendor"), "0x"),
				DeviceID: strings.TrimPrefix(attribute(vfDir, "device"), "0x")}
			if driver, err := os.Readlink(filepath.Join(vfDir, "driver")); err == nil {
				vf.Driver = filepath.Base(driver)
			}
			if netdevs := names(filepath.Join(vfDir, "net")); len(netdevs) > 0 {
				vf.Name = netdevs[0]
			}
			pf.VFs = append(pf.VFs, vf)
		}
		found = append(found, pf)
	}
	return found, nil
}

// MakeVFs sets the PF's VFs to count, as writing sriov_numvfs does: the old ones go first (the
// kernel refuses to change a count that is not 0). More than sriov_totalvfs is refused.
func MakeVFs(sysRoot, pfAddress string, count int) error {
	dir := pciDir(sysRoot, pfAddress)
	total := number(attribute(dir, "sriov_totalvfs"))
	if count > total {
		return fmt.Errorf("%s: %d VFs asked, sriov_totalvfs is %d", pfAddress, count, total)
	}
	if err := removeVFs(sysRoot, dir); err != nil {
		return err
	}
	class, netType := attribute(dir, "class"), ""
	pfNetdevs := names(filepath.Join(dir, "net"))
	if len(pfNetdevs) > 0 {
		netType = attribute(filepath.Join(sysRoot, "class", "net", pfNetdevs[0]), "type")
	}
	rdma := len(names(filepath.Join(dir, "infiniband"))) > 0
	for id := 0; id < count; id++ {
		address, err := vfAddress(pfAddress, id)
		if err != nil {
			return err
		}
		vfDir := pciDir(sysRoot, address)
		if exists(vfDir) {
			return fmt.Errorf("%s: VF %d would be %s, which another function holds", pfAddress, id, address)
		}
		if err := os.MkdirAll(vfDir, 0o755); err != nil {
			return err
		}
		for name, value := range map[string]string{"vendor": "0x15b3", "device": "0x" + vfDeviceID, "class": class} {
			if err := os.WriteFile(filepath.Join(vfDir, name), []byte(value+"\n"), 0o644); err != nil {
				return err
			}
		}
		links := map[string]string{filepath.Join(vfDir, "physfn"): "../" + pfAddress,
			filepath.Join(dir, "virtfn"+strconv.Itoa(id)): "../" + address,
			filepath.Join(vfDir, "driver"):                "../../drivers/mlx5_core"}
		for link, target := range links {
			if err := os.Symlink(target, link); err != nil {
				return err
			}
		}
		if len(pfNetdevs) > 0 {
			netdev := fmt.Sprintf("%sv%d", pfNetdevs[0], id)
			iface := filepath.Join(sysRoot, "class", "net", netdev)
			if err := os.MkdirAll(filepath.Join(vfDir, "net", netdev), 0o755); err != nil {
				return err
			}
			if err := os.MkdirAll(iface, 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(iface, "type"), []byte(netType+"\n"), 0o644); err != nil {
				return err
			}
			if err := os.Symlink("../../../bus/pci/devices/"+address, filepath.Join(iface, "device")); err != nil {
				return err
			}
		}
		if rdma {
			if err := os.MkdirAll(filepath.Join(vfDir, "infiniband", "mlx5_"+strings.NewReplacer(":", "_", ".", "_").Replace(address)), 0o755); err != nil {
				return err
			}
		}
	}
	return os.WriteFile(filepath.Join(dir, "sriov_numvfs"), []byte(strconv.Itoa(count)+"\n"), 0o644)
}

func removeVFs(sysRoot, pfDir string) error {
	links, _ := filepath.Glob(filepath.Join(pfDir, "virtfn*"))
	for _, link := range links {
		target, err := os.Readlink(link)
		if err != nil {
			return err
		}
		vfDir := pciDir(sysRoot, filepath.Base(target))
		for _, netdev := range names(filepath.Join(vfDir, "net")) {
			if err := os.RemoveAll(filepath.Join(sysRoot, "class", "net", netdev)); err != nil {
				return err
			}
		}
		if err := os.RemoveAll(vfDir); err != nil {
			return err
		}
		if err := os.Remove(link); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(pfDir, "sriov_numvfs"), []byte("0\n"), 0o644)
}

// vfAddress: VF id of the PF at function 2 on (the first VF's offset on a ConnectX port).
func vfAddress(pf string, id int) (string, error) {
	parts := strings.Split(pf, ":")
	if len(parts) != 3 {
		return "", fmt.Errorf("%s is not a PCI address", pf)
	}
	slot := id + 2
	return fmt.Sprintf("%s:%s:%02x.%d", parts[0], parts[1], slot/8, slot%8), nil
}

func pciDir(sysRoot, address string) string {
	return filepath.Join(sysRoot, "bus", "pci", "devices", address)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func number(text string) int {
	n, _ := strconv.Atoi(text)
	return n
}

// mtu: what the daemon reads from a port of that link type that nobody configured.
func mtu(linkType string) int {
	if linkType == "infiniband" {
		return 4092
	}
	return 1500
}

// macTail: three octets that differ per PCI address, for a MAC the tree does not hold.
func macTail(address string) string {
	digits := strings.NewReplacer(":", "", ".", "").Replace(address)
	for len(digits) < 6 {
		digits = "0" + digits
	}
	tail := digits[len(digits)-6:]
	return tail[0:2] + ":" + tail[2:4] + ":" + tail[4:6]
}
