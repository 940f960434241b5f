// TEST DOUBLES of the NVIDIA Network Operator's operands that need a ConnectX NIC, for lab nodes
// that have none: one binary that, as busybox does, is the operand it is run as (the name the
// image gives it):
//   - k8s-rdma-shared-dp (rdma.go): the RDMA shared device plugin;
//   - sriov-network-config-daemon (configdaemon.go, vfs.go): the SR-IOV operator's config daemon;
//   - sriovdp (sriovdp.go): the SR-IOV network device plugin.
//
// Each follows what the real one does with its inputs, as read from its source at the release
// the matrix pins (Mellanox/network-operator's manifests, k8s-rdma-shared-dev-plugin), and reads
// the node's double hardware (tests/doubles/hardware's sysfs tree) where the real one reads the
// NIC. It is never part of gpuboot: the lab builds it into the images the operator deploys.
package main

import (
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	switch filepath.Base(os.Args[0]) {
	case "k8s-rdma-shared-dp":
		os.Exit(rdmaSharedMain(os.Args[1:]))
	case "sriov-network-config-daemon":
		os.Exit(configDaemonMain(os.Args[1:]))
	case "sriovdp":
		os.Exit(sriovDPMain(os.Args[1:]))
	default:
		fmt.Fprintf(os.Stderr, "network operands TEST DOUBLE: %q is none of them\n", os.Args[0])
		os.Exit(2)
	}
}
