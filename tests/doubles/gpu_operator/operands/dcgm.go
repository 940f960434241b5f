package main

// The DCGM exporter double (nvcr.io/nvidia/k8s/dcgm-exporter): the node's double GPUs as the
// Prometheus metrics DCGM would give them (a GPU's utilisation, memory, temperature, power,
// all idle), on DCGM_EXPORTER_LISTEN, with /health for the operator's probes. As the real
// exporter it needs its collectors file, and with DCGM_EXPORTER_KUBERNETES the kubelet's
// pod-resources socket (which pod holds which GPU).

import (
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
)

const podResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// idle: the fields the double reports for every GPU, at an idle GPU's values.
var idle = []struct{ field, kind, value string }{
	{"DCGM_FI_DEV_GPU_UTIL", "gauge", "0"},
	{"DCGM_FI_DEV_FB_USED", "gauge", "0"},
	{"DCGM_FI_DEV_GPU_TEMP", "gauge", "30"},
	{"DCGM_FI_DEV_POWER_USAGE", "gauge", "70"},
}

type dcgmSettings struct {
	listen, collectors, node string
	kubernetes               bool
}

func dcgmSettingsFrom(getenv func(string) string, exists func(string) bool) (dcgmSettings, error) {
	settings := dcgmSettings{listen: getenv("DCGM_EXPORTER_LISTEN"), collectors: getenv("DCGM_EXPORTER_COLLECTORS"),
		node: getenv("NODE_NAME"), kubernetes: truthy(getenv("DCGM_EXPORTER_KUBERNETES"))}
	if settings.listen == "" {
		settings.listen = ":9400"
	}
	if settings.collectors == "" {
		settings.collectors = "/etc/dcgm-exporter/default-counters.csv"
	}
	if !exists(settings.collectors) {
		return dcgmSettings{}, fmt.Errorf("collectors file %s: no such file (the image carries the ones the chart names)", settings.collectors)
	}
	if settings.kubernetes && !exists(podResourcesSocket) {
		return dcgmSettings{}, fmt.Errorf("DCGM_EXPORTER_KUBERNETES is on, but %s is not there (mount the kubelet's pod-resources)", podResourcesSocket)
	}
	return settings, nil
}

func metrics(hardware *Hardware, node string) string {
	var text strings.Builder
	for _, metric := range idle {
		fmt.Fprintf(&text, "# HELP %s TEST DOUBLE: an idle GPU's value.\n# TYPE %s %s\n", metric.field, metric.field, metric.kind)
		for _, gpu := range hardware.GPUs {
			fmt.Fprintf(&text, "%s{gpu=\"%d\",UUID=\"%s\",modelName=\"%s\",Hostname=\"%s\"} %s\n", metric.field, gpu.Index,
				gpu.UUID, gpu.Product, node, metric.value)
		}
	}
	return text.String()
}

func dcgmMain() {
	log.SetPrefix("dcgm-exporter TEST DOUBLE: ")
	exists := func(path string) bool { _, err := os.Stat(path); return err == nil }
	settings, err := dcgmSettingsFrom(os.Getenv, exists)
	if err != nil {
		log.Fatal(err)
	}
	hardware, err := LoadHardware(hardwarePath(os.Getenv))
	if err != nil {
		log.Fatal(err)
	}
	http.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "OK") })
	http.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, metrics(hardware, settings.node))
	})
	log.Printf("%d GPUs on %s", len(hardware.GPUs), settings.listen)
	log.Fatal(http.ListenAndServe(settings.listen, nil))
}
