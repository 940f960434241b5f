module gpuboot.local/pause

go 1.24.0
