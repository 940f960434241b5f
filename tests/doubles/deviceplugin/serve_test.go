package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"gpuboot.local/doubles/deviceplugin/plugintest"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type nothing struct {
	api.UnimplementedDevicePluginServer
}

func TestRegistersEachResourceAndAgainAfterAKubeletRestartOrALostSocket(t *testing.T) {
	resources := []Resource{{"example.com/a", "a.sock", &nothing{}}, {"example.com/b", "b.sock", &nothing{}}}
	first, dir := plugintest.Started(t, 2, func(ctx context.Context, dir string) { _ = Serve(ctx, dir, resources) })
	if got := first.Registered(); got[0] != "example.com/a@a.sock" || got[1] != "example.com/b@b.sock" {
		t.Fatalf("registered %v", got)
	}
	if version := first.Requests()[0].Version; version != api.Version {
		t.Fatalf("version %s", version)
	}
	// The kubelet restarts: a new kubelet.sock; every resource registers with the new one.
	first.Stop()
	second, err := plugintest.StartKubelet(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Stop()
	plugintest.Eventually(t, "registration after the kubelet restarted", func() bool { return len(second.Registered()) == 2 })
	// A starting kubelet deletes every plugin's socket: the plugin serves and registers again.
	if err := os.Remove(filepath.Join(dir, "b.sock")); err != nil {
		t.Fatal(err)
	}
	plugintest.Eventually(t, "registration after a socket was deleted", func() bool { return len(second.Registered()) == 4 })
	plugintest.Eventually(t, "the socket back", func() bool {
		_, err := os.Stat(filepath.Join(dir, "b.sock"))
		return err == nil
	})
}
