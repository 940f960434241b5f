// Package plugintest is what the device-plugin doubles' own Go tests share: a TEST DOUBLE of
// the kubelet's registration service (kubelet.go) and the steps of talking to a served plugin.
package plugintest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Eventually fails the test when ok() does not hold within 15 s.
func Eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 15 s: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Started: a kubelet double in a new folder (short: unix socket paths are), `serve(dir)` running
// until the test ends, and the registrations it made within 15 s, `want` of them.
func Started(t *testing.T, want int, serve func(ctx context.Context, dir string)) (*Kubelet, string) {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	kubelet, err := StartKubelet(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kubelet.Stop)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go serve(ctx, dir)
	Eventually(t, "registration", func() bool { return len(kubelet.Registered()) >= want })
	return kubelet, dir
}

// Listed: a client of the plugin on `socket` in dir, and the devices it lists first.
func Listed(t *testing.T, dir, socket string) (api.DevicePluginClient, []*api.Device) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, socket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := api.NewDevicePluginClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := client.ListAndWatch(ctx, &api.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	listed, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return client, listed.Devices
}
