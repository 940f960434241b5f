package plugintest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Kubelet: a TEST DOUBLE of the kubelet's registration service, for the doubles' own tests:
// it records who registered.
type Kubelet struct {
	api.UnimplementedRegistrationServer
	mu     sync.Mutex
	seen   []*api.RegisterRequest
	server *grpc.Server
}

func (k *Kubelet) Register(_ context.Context, request *api.RegisterRequest) (*api.Empty, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.seen = append(k.seen, request)
	return &api.Empty{}, nil
}

// Registered: resource@endpoint of each registration, in order.
func (k *Kubelet) Registered() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, r := range k.seen {
		out = append(out, r.ResourceName+"@"+r.Endpoint)
	}
	return out
}

// Requests: each registration as it came.
func (k *Kubelet) Requests() []*api.RegisterRequest {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*api.RegisterRequest(nil), k.seen...)
}

// Stop: the kubelet goes away (its socket stays, as a killed kubelet's does).
func (k *Kubelet) Stop() { k.server.Stop() }

// StartKubelet serves a new kubelet.sock in dir.
func StartKubelet(dir string) (*Kubelet, error) {
	path := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	k := &Kubelet{server: grpc.NewServer()}
	api.RegisterRegistrationServer(k.server, k)
	go func() { _ = k.server.Serve(listener) }()
	return k, nil
}
