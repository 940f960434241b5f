package main

// The DOCA driver container (the image NVIDIA publishes per DOCA release, OS and architecture;
// the operator's DaemonSet runs its entrypoint with no command). The real one builds or loads
// mlx5_core for the host's kernel and, once the NICs are back, writes the marker its startup
// probe looks for (DRIVER_READY_PATH, by default /run/mellanox/drivers/.driver-ready in the
// host's folder, which the operator mounts with bidirectional propagation); its liveness and
// readiness probes run `lsmod | grep mlx5_core`. The marker is cleared on every start and
// teardown (Mellanox/doca-driver-build's entrypoint, commonCleanup); with
// RESTORE_DRIVER_ON_POD_TERMINATION=true the inbox driver is put back when it stops.
//
// The double checks what the entrypoint reads of the host through the operator's mounts,
// sets and clears the marker as the entrypoint does, and answers lsmod with the modules the
// loaded driver would show while the marker is there.

import (
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

const (
	driversFolder = "/run/mellanox/drivers"
	driverReady   = driversFolder + "/.driver-ready"
)

// What the DaemonSet mounts of the host that the real entrypoint reads before it loads
// anything: the OS (it picks its packages by it), the kernel's modules and the shared folder.
var docaMounts = []string{"/host/etc/os-release", "/host/lib/modules", driversFolder}

// The modules of a loaded DOCA driver, as lsmod prints them.
const loadedModules = `mlx5_ib               495616  0
ib_uverbs             184320  1 mlx5_ib
mlx5_core            2400256  1 mlx5_ib
mlxfw                  36864  1 mlx5_core
ib_core               471040  2 ib_uverbs,mlx5_ib
`

func docaDriverMain(args []string) int {
	if len(args) > 0 {
		log.Printf("DOCA driver TEST DOUBLE: the operator runs the image's entrypoint with no arguments, got %q", args)
		return 2
	}
	ready := os.Getenv("DRIVER_READY_PATH")
	if ready == "" {
		ready = driverReady
	}
	return runDriver(docaMounts, ready, os.Getenv("RESTORE_DRIVER_ON_POD_TERMINATION") == "true", nil)
}

// runDriver: the driver's life, until SIGTERM (or `stop`, for tests): returns the exit code.
func runDriver(mounts []string, ready string, restore bool, stop <-chan struct{}) int {
	for _, path := range mounts {
		if _, err := os.Stat(path); err != nil {
			log.Printf("DOCA driver TEST DOUBLE: %s is not there (the operator's DaemonSet mounts it): %v", path, err)
			return 1
		}
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(signals)
	if err := os.RemoveAll(ready); err != nil { // a marker left by an earlier container
		log.Printf("DOCA driver TEST DOUBLE: clearing %s: %v", ready, err)
		return 1
	}
	if err := os.MkdirAll(filepath.Dir(ready), 0o755); err != nil {
		log.Printf("DOCA driver TEST DOUBLE: %v", err)
		return 1
	}
	if err := os.WriteFile(ready, nil, 0o644); err != nil {
		log.Printf("DOCA driver TEST DOUBLE: writing %s: %v", ready, err)
		return 1
	}
	log.Printf("DOCA driver TEST DOUBLE: mlx5_core loaded (no NIC here); %s written", ready)
	select {
	case <-signals:
	case <-stop:
	}
	if restore {
		log.Printf("DOCA driver TEST DOUBLE: inbox driver restored")
	}
	if err := os.RemoveAll(ready); err != nil {
		log.Printf("DOCA driver TEST DOUBLE: clearing %s: %v", ready, err)
		return 1
	}
	return 0
}

// lsmod: the loaded driver's modules once the marker is there, none before.
func lsmodMain() int {
	fmt.Print(lsmod(driverReady))
	return 0
}

func lsmod(ready string) string {
	out := "Module                  Size  Used by\n"
	if _, err := os.Stat(ready); err == nil {
		out += loadedModules
	}
	return out
}
