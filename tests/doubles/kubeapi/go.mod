// The API-server side of the TEST DOUBLES' operands (built by the lab, never part of gpuboot).
module gpuboot.local/doubles/kubeapi

go 1.26.0
