package kubeapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRequestsCarryTheTokenAndPatchesTheirType(t *testing.T) {
	var seen []string
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization")+" "+r.Header.Get("Content-Type")+" "+string(body))
		switch r.URL.Path {
		case "/missing":
			http.Error(w, "not found", http.StatusNotFound)
		case "/broken":
			http.Error(w, `{"message":"forbidden"}`, http.StatusForbidden)
		default:
			_, _ = w.Write([]byte(`{"metadata":{"name":"n1"}}`))
		}
	}))
	defer server.Close()
	k := &Client{Base: server.URL, Token: "t0k", HTTP: server.Client()}
	var got struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	if status, err := k.Do("GET", "/api/v1/nodes/n1", nil, &got); err != nil || status != 200 || got.Metadata.Name != "n1" {
		t.Fatalf("%d %v %+v", status, err, got)
	}
	// Not found is a status to read, not an error.
	if status, err := k.Do("GET", "/missing", nil, nil); err != nil || status != 404 {
		t.Fatalf("%d %v", status, err)
	}
	if _, err := k.Do("GET", "/broken", nil, nil); err == nil || !strings.Contains(err.Error(), "403") ||
		!strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("error %v", err)
	}
	if err := k.MergePatch("/api/v1/nodes/n1", map[string]any{"a": 1}); err != nil {
		t.Fatal(err)
	}
	if seen[0] != "GET /api/v1/nodes/n1 Bearer t0k application/json " ||
		seen[3] != `PATCH /api/v1/nodes/n1 Bearer t0k application/merge-patch+json {"a":1}` {
		t.Fatalf("requests %q", seen)
	}
}

func TestOutsideAPodThereIsNoClient(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := InCluster(); err == nil || !strings.Contains(err.Error(), "not in a pod") {
		t.Fatalf("error %v", err)
	}
}
