// TEST DOUBLE of NVIDIA's container toolkit (nvcr.io/nvidia/k8s/container-toolkit) in the mode
// gpuboot gives it with containerd 2.1+ and GPU Operator 26.3+: CDI on, the toolkit an NRI
// plugin. Run as the toolkit DaemonSet's `nvidia-toolkit`, after its entrypoint has waited for
// the validator's driver-ready file and sourced it, it does what the real one does there:
//   - writes the CDI spec for management containers (management.nvidia.com/gpu=all) under
//     /var/run/cdi, from the driver root the validator found (a lab node's nvidia-smi double and
//     the file that stands for what NVML reports);
//   - registers with containerd's NRI socket and gives each container the CDI devices its pod
//     is annotated with (nvidia.cdi.k8s.io/container.<name>), management devices only to the
//     allowed namespaces; containerd resolves them from the spec;
//   - writes its pid file, and removes it and the spec when stopped.
//
// It refuses any other mode, as the lab has none of it to double.
//
// It is never part of gpuboot: the lab builds it into the image the GPU Operator deploys as
// its container toolkit.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/containerd/nri/pkg/stub"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("nvidia-toolkit TEST DOUBLE: ")
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	cfg, err := configFrom(os.Getenv)
	if err != nil {
		return err
	}
	if err := checkSocket(cfg.NRISocket); err != nil {
		return err
	}
	spec, err := managementSpec(cfg)
	if err != nil {
		return err
	}
	specPath, err := writeSpec(cfg.CDIOutputDir, spec)
	if err != nil {
		return fmt.Errorf("writing the CDI spec: %w", err)
	}
	log.Printf("CDI spec %s: %s=all", specPath, cfg.CDIKind)
	if err := os.MkdirAll(filepath.Dir(cfg.PIDFile), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(cfg.PIDFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(cfg.PIDFile)
	defer os.Remove(specPath)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	closed := make(chan struct{})
	plugin, err := stub.New(&injector{namespaces: cfg.NRINamespaces, managementKind: cfg.CDIKind},
		stub.WithPluginName("nvidia-container-toolkit"), stub.WithPluginIdx(cfg.NRIPluginIndex),
		stub.WithSocketPath(cfg.NRISocket), stub.WithOnClose(func() { close(closed) }))
	if err != nil {
		return fmt.Errorf("failed to initialise plugin at %s: %w", cfg.NRISocket, err)
	}
	if err := plugin.Start(ctx); err != nil {
		return fmt.Errorf("plugin exited with error: %w", err)
	}
	log.Printf("NRI plugin %s-nvidia-container-toolkit registered at %s", cfg.NRIPluginIndex, cfg.NRISocket)
	select {
	case <-ctx.Done():
		plugin.Stop()
		return nil
	case <-closed:
		// containerd restarted: exit, and the kubelet starts the container again (the real
		// plugin reconnects in place; either way the node gets a plugin again).
		return fmt.Errorf("NRI connection to %s closed", cfg.NRISocket)
	}
}
