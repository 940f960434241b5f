package main

// The GPU Feature Discovery double (k8s-device-plugin's gpu-feature-discovery): the node's GPU
// labels from its double GPUs and the plugin's config, published as the real GFD v0.20 does by
// default, in a NodeFeature object (nfd.k8s-sigs.io/v1alpha1) that NFD's master turns into
// node labels (the gpu-operator chart lets NFD take the nvidia.com namespace), or to the
// features.d file with USE_NODE_FEATURE_API=false. It labels again every GFD_SLEEP_INTERVAL and
// on SIGHUP (the config manager's signal after a config change).

import (
	"fmt"
	"gpuboot.local/doubles/kubeapi"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	nodeFeatureAPI  = "/apis/nfd.k8s-sigs.io/v1alpha1"
	nodeNameLabel   = "nfd.node.kubernetes.io/node-name"
	nodeFeatureName = "nvidia-features-for"
)

// gfdSettings: the env the operator gives GFD, with the real one's defaults.
type gfdSettings struct {
	node, namespace, pod string
	interval             time.Duration
	useNodeFeatureAPI    bool
	outputFile           string
	configFile           string
	noTimestamp          bool
	oneshot              bool
}

func gfdSettingsFrom(getenv func(string) string) (gfdSettings, error) {
	settings := gfdSettings{node: getenv("NODE_NAME"), namespace: getenv("NAMESPACE"), pod: getenv("POD_NAME"),
		interval: 60 * time.Second, useNodeFeatureAPI: true,
		outputFile: "/etc/kubernetes/node-feature-discovery/features.d/gfd",
		configFile: firstSet(getenv, "GFD_CONFIG_FILE", "CONFIG_FILE"), noTimestamp: truthy(getenv("GFD_NO_TIMESTAMP")),
		oneshot: truthy(getenv("GFD_ONESHOT"))}
	if value := getenv("GFD_SLEEP_INTERVAL"); value != "" {
		interval, err := time.ParseDuration(value)
		if err != nil || interval <= 0 {
			return gfdSettings{}, fmt.Errorf("GFD_SLEEP_INTERVAL %q is not a duration", value)
		}
		settings.interval = interval
	}
	if value := firstSet(getenv, "GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"); value != "" {
		use, err := strconv.ParseBool(value)
		if err != nil {
			return gfdSettings{}, fmt.Errorf("USE_NODE_FEATURE_API %q is not a boolean", value)
		}
		settings.useNodeFeatureAPI = use
	}
	if value := getenv("GFD_OUTPUT_FILE"); value != "" {
		settings.outputFile = value
	}
	if settings.useNodeFeatureAPI && (settings.node == "" || settings.namespace == "") {
		return gfdSettings{}, fmt.Errorf("the NodeFeature API needs NODE_NAME and NAMESPACE (the operator sets both)")
	}
	return settings, nil
}

func firstSet(getenv func(string) string, keys ...string) string {
	for _, key := range keys {
		if value := getenv(key); value != "" {
			return value
		}
	}
	return ""
}

func truthy(value string) bool {
	b, err := strconv.ParseBool(value)
	return err == nil && b
}

// productLabel: the model's name as a label value (spaces to dashes, as the real GFD does).
func productLabel(product string) string {
	return strings.Join(strings.Fields(product), "-")
}

// gfdLabels: what the real GFD labels for these GPUs under this config.
func gfdLabels(hardware *Hardware, config *Config, now time.Time, noTimestamp bool) (map[string]string, error) {
	labels := map[string]string{}
	if len(hardware.GPUs) == 0 {
		return labels, nil
	}
	strategy, err := config.Strategy()
	if err != nil {
		return nil, err
	}
	resources, err := Resources(hardware, config)
	if err != nil {
		return nil, err
	}
	first := hardware.GPUs[0]
	product := productLabel(first.Product)
	replicas, sharing := 1, "none"
	if ts := config.Sharing.TimeSlicing; ts != nil {
		for _, resource := range ts.Resources {
			if fullName(resource.Name) == resourcePrefix+"gpu" {
				replicas, sharing = resource.Replicas, "time-slicing"
				if resource.Rename == "" && !ts.RenameByDefault {
					product += "-SHARED"
				}
			}
		}
	}
	labels["nvidia.com/gpu.count"] = strconv.Itoa(len(hardware.GPUs))
	labels["nvidia.com/gpu.product"] = product
	labels["nvidia.com/gpu.replicas"] = strconv.Itoa(replicas)
	labels["nvidia.com/gpu.sharing-strategy"] = sharing
	labels["nvidia.com/mig.capable"] = strconv.FormatBool(first.MIGCapable)
	if first.MIGCapable {
		labels["nvidia.com/mig.strategy"] = strategy
	}
	if first.Family != "" {
		labels["nvidia.com/gpu.family"] = first.Family
	}
	if first.MemoryMiB > 0 {
		labels["nvidia.com/gpu.memory"] = strconv.Itoa(first.MemoryMiB)
	}
	for name, devices := range resources {
		if profile, found := strings.CutPrefix(name, resourcePrefix+"mig-"); found {
			labels["nvidia.com/mig-"+profile+".count"] = strconv.Itoa(len(devices))
		}
	}
	if !noTimestamp {
		labels["nvidia.com/gfd.timestamp"] = strconv.FormatInt(now.Unix(), 10)
	}
	return labels, nil
}

// publishNodeFeature creates or updates the node's NodeFeature object with the labels, owned
// by GFD's DaemonSet (so that removing GFD removes its labels), as the real GFD does.
func publishNodeFeature(k *kubeapi.Client, settings gfdSettings, labels map[string]string) error {
	name := nodeFeatureName + "-" + settings.node
	path := fmt.Sprintf("%s/namespaces/%s/nodefeatures/%s", nodeFeatureAPI, settings.namespace, name)
	var existing map[string]any
	status, err := k.Do("GET", path, nil, &existing)
	if err != nil {
		return fmt.Errorf("failed to get NodeFeature object: %w", err)
	}
	metadata := map[string]any{"name": name, "labels": map[string]string{nodeNameLabel: settings.node}}
	if owners, err := daemonSetOwner(k, settings); err != nil {
		return err
	} else if owners != nil {
		metadata["ownerReferences"] = owners
	}
	object := map[string]any{"apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature", "metadata": metadata,
		// The CRD requires spec.features; GFD publishes labels only, so its feature sets are empty.
		"spec": map[string]any{"labels": labels, "features": map[string]any{
			"flags": map[string]any{}, "attributes": map[string]any{}, "instances": map[string]any{}}}}
	if status == 404 {
		_, err = k.Do("POST", fmt.Sprintf("%s/namespaces/%s/nodefeatures", nodeFeatureAPI, settings.namespace), object, nil)
		return err
	}
	metadata["resourceVersion"] = existing["metadata"].(map[string]any)["resourceVersion"]
	_, err = k.Do("PUT", path, object, nil)
	return err
}

// daemonSetOwner: the DaemonSet that owns this pod, as an owner reference (none outside one).
func daemonSetOwner(k *kubeapi.Client, settings gfdSettings) ([]map[string]any, error) {
	if settings.pod == "" {
		return nil, nil
	}
	var pod struct {
		Metadata struct {
			OwnerReferences []map[string]any `json:"ownerReferences"`
		} `json:"metadata"`
	}
	if _, err := k.Do("GET", fmt.Sprintf("/api/v1/namespaces/%s/pods/%s", settings.namespace, settings.pod), nil, &pod); err != nil {
		return nil, fmt.Errorf("failed to get pod %s/%s: %w", settings.namespace, settings.pod, err)
	}
	for _, owner := range pod.Metadata.OwnerReferences {
		if owner["kind"] == "DaemonSet" {
			return []map[string]any{{"apiVersion": owner["apiVersion"], "kind": "DaemonSet", "name": owner["name"],
				"uid": owner["uid"]}}, nil
		}
	}
	return nil, nil
}

// writeFeatureFile: the labels as NFD's local source reads them, whole or not at all.
func writeFeatureFile(path string, labels map[string]string) error {
	keys := make([]string, 0, len(labels))
	for key := range labels {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	var text strings.Builder
	for _, key := range keys {
		fmt.Fprintf(&text, "%s=%s\n", key, labels[key])
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", []byte(text.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

func gfdMain() {
	log.SetPrefix("gpu-feature-discovery TEST DOUBLE: ")
	settings, err := gfdSettingsFrom(os.Getenv)
	if err != nil {
		log.Fatal(err)
	}
	var k *kubeapi.Client
	if settings.useNodeFeatureAPI {
		if k, err = kubeapi.InCluster(); err != nil {
			log.Fatal(err)
		}
	}
	hangups := make(chan os.Signal, 1)
	signal.Notify(hangups, syscall.SIGHUP)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	for {
		if err := gfdOnce(k, settings); err != nil {
			// GFD_FAIL_ON_INIT_ERROR (the operator's: true): no GPUs to label is an error.
			log.Fatal(err)
		}
		if settings.oneshot {
			return
		}
		select {
		case <-stop:
			return
		case <-hangups:
			log.Printf("SIGHUP: the config changed, labelling again")
		case <-time.After(settings.interval):
		}
	}
}

func gfdOnce(k *kubeapi.Client, settings gfdSettings) error {
	config, err := LoadConfig(settings.configFile)
	if err != nil {
		return err
	}
	hardware, err := LoadHardware(hardwarePath(os.Getenv))
	if err != nil {
		return err
	}
	labels, err := gfdLabels(hardware, config, time.Now(), settings.noTimestamp)
	if err != nil {
		return err
	}
	if settings.useNodeFeatureAPI {
		err = publishNodeFeature(k, settings, labels)
	} else {
		err = writeFeatureFile(settings.outputFile, labels)
	}
	if err == nil {
		log.Printf("%d labels for %s", len(labels), settings.node)
	}
	return err
}
