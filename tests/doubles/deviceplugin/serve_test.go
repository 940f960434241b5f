package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type nothing struct {
	api.UnimplementedDevicePluginServer
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 15 s: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRegistersEachResourceAndAgainAfterAKubeletRestartOrALostSocket(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "dp") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	first, err := StartKubelet(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resources := []Resource{{"example.com/a", "a.sock", &nothing{}}, {"example.com/b", "b.sock", &nothing{}}}
	go func() { _ = Serve(ctx, dir, resources) }()
	eventually(t, "registration", func() bool { return len(first.Registered()) == 2 })
	if got := first.Registered(); got[0] != "example.com/a@a.sock" || got[1] != "example.com/b@b.sock" {
		t.Fatalf("registered %v", got)
	}
	if version := first.Requests()[0].Version; version != api.Version {
		t.Fatalf("version %s", version)
	}
	// The kubelet restarts: a new kubelet.sock; every resource registers with the new one.
	first.Stop()
	second, err := StartKubelet(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Stop()
	eventually(t, "registration after the kubelet restarted", func() bool { return len(second.Registered()) == 2 })
	// A starting kubelet deletes every plugin's socket: the plugin serves and registers again.
	if err := os.Remove(filepath.Join(dir, "b.sock")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "registration after a socket was deleted", func() bool { return len(second.Registered()) == 4 })
	eventually(t, "the socket back", func() bool {
		_, err := os.Stat(filepath.Join(dir, "b.sock"))
		return err == nil
	})
}
