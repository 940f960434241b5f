package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuboot.local/doubles/kubeapi"
)

// fakeAPI: an API server's object store for the daemon's requests (GET, merge PATCH, DELETE,
// pods listed by label and node), as a unit-test stand-in.
type fakeAPI struct {
	mu      sync.Mutex
	objects map[string]map[string]any
	deleted []string
}

func (f *fakeAPI) put(path string, object map[string]any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.objects[path] = object
}

func (f *fakeAPI) get(path string) map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	data, _ := json.Marshal(f.objects[path])
	var copied map[string]any
	_ = json.Unmarshal(data, &copied)
	return copied
}

// merge: RFC 7386, as the API server applies a merge patch.
func merge(target map[string]any, patch map[string]any) map[string]any {
	if target == nil {
		target = map[string]any{}
	}
	for key, value := range patch {
		switch v := value.(type) {
		case nil:
			delete(target, key)
		case map[string]any:
			inner, _ := target[key].(map[string]any)
			target[key] = merge(inner, v)
		default:
			target[key] = v
		}
	}
	return target
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	path := r.URL.Path
	switch r.Method {
	case "GET":
		if strings.HasSuffix(path, "/pods") {
			var items []any
			for key, pod := range f.objects {
				spec, _ := pod["spec"].(map[string]any)
				labels, _ := pod["metadata"].(map[string]any)["labels"].(map[string]any)
				if strings.HasPrefix(key, path+"/") && labels["app"] == "sriov-device-plugin" &&
					"spec.nodeName="+spec["nodeName"].(string) == r.URL.Query().Get("fieldSelector") {
					items = append(items, pod)
				}
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"items": items})
			return
		}
		object, ok := f.objects[path]
		if !ok {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(object)
	case "PATCH":
		if r.Header.Get("Content-Type") != "application/merge-patch+json" {
			http.Error(w, "unsupported patch", http.StatusUnsupportedMediaType)
			return
		}
		path = strings.TrimSuffix(path, "/status")
		object, ok := f.objects[path]
		if !ok {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var patch map[string]any
		if err := json.Unmarshal(body, &patch); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if strings.HasSuffix(r.URL.Path, "/status") {
			patch = map[string]any{"status": patch["status"]}
		}
		f.objects[path] = merge(object, patch)
		_ = json.NewEncoder(w).Encode(f.objects[path])
	case "DELETE":
		delete(f.objects, path)
		f.deleted = append(f.deleted, path)
	}
}

const (
	statePath = "/apis/sriovnetwork.openshift.io/v1/namespaces/nvidia-network-operator/sriovnetworknodestates/hgx01"
	nodePath  = "/api/v1/nodes/hgx01"
	podsPath  = "/api/v1/namespaces/nvidia-network-operator/pods/"
)

func sriovTree(t *testing.T) string {
	sys := hgx(t)
	for _, address := range []string{"0000:1a:00.0", "0000:2a:00.0", "0000:c1:00.0", "0000:3a:00.0"} {
		mustWrite(t, filepath.Join(sys, "bus", "pci", "devices", address, "sriov_totalvfs"), "16\n")
		mustWrite(t, filepath.Join(sys, "bus", "pci", "devices", address, "sriov_numvfs"), "0\n")
	}
	return sys
}

func daemon(t *testing.T) (*configDaemon, *fakeAPI, string) {
	api := &fakeAPI{objects: map[string]map[string]any{
		nodePath: {"metadata": map[string]any{"name": "hgx01"}},
		statePath: {"metadata": map[string]any{"name": "hgx01", "namespace": "nvidia-network-operator", "generation": 1},
			"spec": map[string]any{"interfaces": []any{map[string]any{"pciAddress": "0000:1a:00.0", "numVfs": 4}}}},
		podsPath + "sriov-device-plugin-a": {"metadata": map[string]any{"name": "sriov-device-plugin-a",
			"labels": map[string]any{"app": "sriov-device-plugin"}}, "spec": map[string]any{"nodeName": "hgx01"}},
		podsPath + "sriov-device-plugin-b": {"metadata": map[string]any{"name": "sriov-device-plugin-b",
			"labels": map[string]any{"app": "sriov-device-plugin"}}, "spec": map[string]any{"nodeName": "hgx02"}},
	}}
	server := httptest.NewServer(api)
	t.Cleanup(server.Close)
	sys := sriovTree(t)
	return &configDaemon{k: &kubeapi.Client{Base: server.URL, Token: "token", HTTP: server.Client()},
		node: "hgx01", namespace: "nvidia-network-operator", sysRoot: sys}, api, sys
}

func step(t *testing.T, d *configDaemon, want string) {
	t.Helper()
	said, err := d.Step()
	if err != nil || !strings.HasPrefix(said, want) {
		t.Fatalf("said %q, %v; want %q", said, err, want)
	}
}

func annotate(api *fakeAPI, path string, annotations map[string]any) {
	object := api.get(path)
	api.put(path, merge(object, map[string]any{"metadata": map[string]any{"annotations": annotations}}))
}

func setSpec(api *fakeAPI, generation int, interfaces ...map[string]any) {
	object := api.get(statePath)
	object["metadata"].(map[string]any)["generation"] = generation
	list := []any{}
	for _, i := range interfaces {
		list = append(list, i)
	}
	object["spec"] = map[string]any{"interfaces": list}
	api.put(statePath, object)
}

func status(api *fakeAPI) map[string]any {
	got, _ := api.get(statePath)["status"].(map[string]any)
	return got
}

func reported(t *testing.T, api *fakeAPI, address string) map[string]any {
	t.Helper()
	for _, item := range status(api)["interfaces"].([]any) {
		if pf := item.(map[string]any); pf["pciAddress"] == address {
			return pf
		}
	}
	t.Fatalf("%s not reported: %v", address, status(api)["interfaces"])
	return nil
}

func TestTheDaemonWaitsForTheDrainControllersAnnotations(t *testing.T) {
	d, api, _ := daemon(t)
	step(t, d, "waiting for the drain controller")
	if status(api) != nil {
		t.Fatalf("reported before the drain controller annotated the state: %v", status(api))
	}
	delete(api.objects, statePath)
	step(t, d, "no SriovNetworkNodeState")
}

func TestFirstVFsNeedNoDrainAndTheDevicePluginIsRestartedAndUnblocked(t *testing.T) {
	d, api, sys := daemon(t)
	annotate(api, statePath, map[string]any{desiredStateAnno: drainIdle, currentStateAnno: drainIdle})
	step(t, d, "applied generation 1")
	if got := status(api)["syncStatus"]; got != syncSucceeded {
		t.Fatalf("sync %v", got)
	}
	pf := reported(t, api, "0000:1a:00.0")
	if pf["numVfs"] != 4.0 || pf["totalvfs"] != 16.0 || pf["linkType"] != "IB" || pf["name"] != "ens1f0np0" ||
		pf["mtu"] != 4092.0 || len(pf["Vfs"].([]any)) != 4 {
		t.Fatalf("reported %v", pf)
	}
	vf := pf["Vfs"].([]any)[3].(map[string]any)
	if vf["vfID"] != 3.0 || vf["pciAddress"] != "0000:1a:00.5" || vf["deviceID"] != vfDeviceID || vf["name"] != "ens1f0np0v3" ||
		vf["driver"] != "mlx5_core" {
		t.Fatalf("VF %v", vf)
	}
	// The ports are the tree's: the RDMA device plugins read the VFs there as they read PFs.
	ports, err := Ports(sys)
	if err != nil || len(ports) != 8 {
		t.Fatalf("ports %v, %v", ports, err)
	}
	if vfPort := ports[4]; vfPort.PCIAddress != "0000:1a:00.5" || vfPort.LinkType != "infiniband" || len(vfPort.RDMA) != 1 {
		t.Fatalf("VF as a port %+v", vfPort)
	}
	if len(api.deleted) != 1 || api.deleted[0] != podsPath+"sriov-device-plugin-a" {
		t.Fatalf("restarted %v (only this node's device plugin)", api.deleted)
	}
	node := api.get(nodePath)["metadata"].(map[string]any)["annotations"].(map[string]any)
	if node[nodeDrainAnno] != drainIdle {
		t.Fatalf("node annotations %v", node)
	}
	api.put(podsPath+"sriov-device-plugin-c", map[string]any{"metadata": map[string]any{"name": "sriov-device-plugin-c",
		"labels": map[string]any{"app": "sriov-device-plugin"}, "annotations": map[string]any{waitForConfigAnno: "true"}},
		"spec": map[string]any{"nodeName": "hgx01"}})
	step(t, d, "in sync")
	if annotations := api.get(podsPath + "sriov-device-plugin-c")["metadata"].(map[string]any)["annotations"]; len(annotations.(map[string]any)) != 0 {
		t.Fatalf("the device plugin is still blocked: %v", annotations)
	}
}

func TestAnotherCountOnAPortWithVFsWaitsForTheOperatorsDrain(t *testing.T) {
	d, api, _ := daemon(t)
	annotate(api, statePath, map[string]any{desiredStateAnno: drainIdle, currentStateAnno: drainIdle})
	step(t, d, "applied generation 1")
	setSpec(api, 2, map[string]any{"pciAddress": "0000:1a:00.0", "numVfs": 8})
	step(t, d, "asked the operator to drain")
	if status(api)["syncStatus"] != syncInProgress {
		t.Fatalf("sync %v", status(api)["syncStatus"])
	}
	state := api.get(statePath)["metadata"].(map[string]any)["annotations"].(map[string]any)
	node := api.get(nodePath)["metadata"].(map[string]any)["annotations"].(map[string]any)
	if state[desiredStateAnno] != drainRequired || node[nodeDrainAnno] != drainRequired {
		t.Fatalf("state %v, node %v", state, node)
	}
	annotate(api, statePath, map[string]any{currentStateAnno: draining})
	step(t, d, "the operator is draining")
	if reported(t, api, "0000:1a:00.0")["numVfs"] != 4.0 {
		t.Fatal("VFs changed before the drain completed")
	}
	annotate(api, statePath, map[string]any{currentStateAnno: drainComplete})
	step(t, d, "applied generation 2")
	if reported(t, api, "0000:1a:00.0")["numVfs"] != 8.0 || status(api)["syncStatus"] != syncSucceeded {
		t.Fatalf("status %v", status(api))
	}
	if api.get(statePath)["metadata"].(map[string]any)["annotations"].(map[string]any)[desiredStateAnno] != drainIdle {
		t.Fatal("not annotated Idle again")
	}
	// A port no policy configures any more loses its VFs, after a drain.
	annotate(api, statePath, map[string]any{currentStateAnno: drainIdle})
	setSpec(api, 3)
	step(t, d, "asked the operator to drain")
	annotate(api, statePath, map[string]any{currentStateAnno: drainComplete})
	step(t, d, "applied generation 3")
	if pf := reported(t, api, "0000:1a:00.0"); pf["numVfs"] != nil || pf["Vfs"] != nil {
		t.Fatalf("VFs left %v", pf)
	}
	if entries, _ := os.ReadDir(filepath.Join(d.sysRoot, "class", "net")); len(entries) != 4 {
		t.Fatalf("VF netdevs left: %v", entries)
	}
}

func TestACountThePortCannotHaveFailsWithTheReason(t *testing.T) {
	d, api, _ := daemon(t)
	annotate(api, statePath, map[string]any{desiredStateAnno: drainIdle, currentStateAnno: drainIdle})
	setSpec(api, 1, map[string]any{"pciAddress": "0000:2a:00.0", "numVfs": 32})
	step(t, d, "failed")
	if status(api)["syncStatus"] != syncFailed ||
		status(api)["lastSyncError"] != "double: ens2f0np0 (0000:2a:00.0) sriov_totalvfs is 16, 32 VFs asked" {
		t.Fatalf("status %v", status(api))
	}
	setSpec(api, 2, map[string]any{"pciAddress": "0000:9f:00.0", "numVfs": 2})
	step(t, d, "failed")
	if status(api)["lastSyncError"] != "double: no physical function 0000:9f:00.0 on the node" {
		t.Fatalf("status %v", status(api))
	}
}

func TestWaitForConfigHoldsUntilTheAnnotationIsTakenOff(t *testing.T) {
	api := &fakeAPI{objects: map[string]map[string]any{podsPath + "dp": {"metadata": map[string]any{"name": "dp"}}}}
	server := httptest.NewServer(api)
	defer server.Close()
	k := &kubeapi.Client{Base: server.URL, Token: "token", HTTP: server.Client()}
	done := make(chan error, 1)
	go func() {
		done <- waitForConfig(context.Background(), k, "nvidia-network-operator", "dp", 10*time.Millisecond)
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("returned with the annotation on: %v", err)
	default:
	}
	annotate(api, podsPath+"dp", map[string]any{waitForConfigAnno: nil})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
