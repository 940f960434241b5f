// Package deviceplugin is what the TEST DOUBLES' device plugins share: serving each resource on
// a socket in the kubelet's device-plugin folder and registering it with the kubelet through
// the device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1), again whenever the
// kubelet restarts, as NVIDIA's plugins do. What a plugin lists and allocates is its own.
//
// It is never part of gpuboot: the lab builds it into the doubles' images.
package deviceplugin

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Resource: one extended resource, the socket it is served on (a name in the kubelet's
// folder) and the server that lists and allocates its devices.
type Resource struct {
	Name     string
	Endpoint string
	Server   api.DevicePluginServer
}

// Serve registers every resource with the kubelet whose socket is in dir and serves it until
// ctx ends, registering again after each kubelet restart.
func Serve(ctx context.Context, dir string, resources []Resource) error {
	kubeletSocket := filepath.Join(dir, filepath.Base(api.KubeletSocket))
	for {
		seen, err := waitFor(ctx, kubeletSocket)
		if err != nil {
			return nil // stopped
		}
		var servers []*grpc.Server
		var sockets []string
		for _, resource := range resources {
			server, err := start(dir, resource)
			if err != nil {
				return err
			}
			servers = append(servers, server)
			sockets = append(sockets, filepath.Join(dir, resource.Endpoint))
			if err := register(ctx, kubeletSocket, resource); err != nil {
				log.Printf("registering %s: %v (retrying when the kubelet restarts)", resource.Name, err)
			} else {
				log.Printf("registered %s on %s", resource.Name, resource.Endpoint)
			}
		}
		restarted := waitForChange(ctx, kubeletSocket, seen, sockets)
		for _, server := range servers {
			server.Stop()
		}
		if !restarted {
			return nil
		}
		log.Printf("the kubelet restarted: registering again")
	}
}

func start(dir string, resource Resource) (*grpc.Server, error) {
	path := filepath.Join(dir, resource.Endpoint)
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %v", path, err)
	}
	server := grpc.NewServer()
	api.RegisterDevicePluginServer(server, resource.Server)
	go func() { _ = server.Serve(listener) }()
	return server, nil
}

func register(ctx context.Context, kubeletSocket string, resource Resource) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = api.NewRegistrationClient(conn).Register(callCtx, &api.RegisterRequest{
		Version: api.Version, Endpoint: resource.Endpoint, ResourceName: resource.Name,
		Options: &api.DevicePluginOptions{GetPreferredAllocationAvailable: false},
	})
	return err
}

// socketID: what tells one kubelet.sock from the next: a restarted kubelet makes it anew (an
// inode number can be reused, its change time is new).
type socketID struct {
	inode uint64
	ctime syscall.Timespec
}

func identify(path string) (socketID, bool) {
	info, err := os.Stat(path)
	if err != nil {
		return socketID{}, false
	}
	stat := info.Sys().(*syscall.Stat_t)
	return socketID{stat.Ino, stat.Ctim}, true
}

// waitFor: the kubelet socket's identity once it exists.
func waitFor(ctx context.Context, path string) (socketID, error) {
	for {
		if id, found := identify(path); found {
			return id, nil
		}
		select {
		case <-ctx.Done():
			return socketID{}, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// waitForChange: true when the kubelet restarted (its socket made anew, or ours removed: a
// starting kubelet deletes every plugin's socket), false when ctx ended.
func waitForChange(ctx context.Context, path string, seen socketID, ours []string) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Second):
		}
		if id, found := identify(path); found && id != seen {
			return true
		}
		for _, socket := range ours {
			if _, err := os.Stat(socket); err != nil {
				return true
			}
		}
	}
}

// Defaults: what a plugin answers where it has nothing of its own to say (no options, no
// preferred allocation, nothing before a container starts), as NVIDIA's plugins answer.
type Defaults struct {
	api.UnimplementedDevicePluginServer
}

func (Defaults) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

func (Defaults) GetPreferredAllocation(context.Context, *api.PreferredAllocationRequest) (*api.PreferredAllocationResponse, error) {
	return &api.PreferredAllocationResponse{}, nil
}

func (Defaults) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}
