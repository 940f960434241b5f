// TEST DOUBLES of the GPU Operator's operands that read GPUs through NVML (built by the lab, never part of gpuboot).
module gpuboot.local/doubles/gpu-operands

go 1.26.0

require (
	google.golang.org/grpc v1.79.3
	k8s.io/kubelet v0.36.3
	sigs.k8s.io/yaml v1.6.0
	tags.cncf.io/container-device-interface/specs-go v1.1.1
)

require (
	go.yaml.in/yaml/v2 v2.4.3 // indirect
	golang.org/x/net v0.49.0 // indirect
	golang.org/x/sys v0.40.0 // indirect
	golang.org/x/text v0.33.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260128011058-8636f8732409 // indirect
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af // indirect
)

require (
	gpuboot.local/doubles/deviceplugin v0.0.0
	gpuboot.local/doubles/kubeapi v0.0.0
)

// The kubelet and API-server sides the doubles share, from the trees beside this one.
replace gpuboot.local/doubles/deviceplugin => ../../deviceplugin

replace gpuboot.local/doubles/kubeapi => ../../kubeapi
