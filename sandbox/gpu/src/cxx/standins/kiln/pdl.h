// kiln: the device side of programmatic dependent launch. nvcc declares these two for
// every source (through cuda_device_runtime_api.h); NVRTC does not. Each is one PTX
// instruction (sm_90+): wait until the grids this one depends on have completed or
// triggered, and let the grids that depend on this one start. Without a programmatic
// launch both return at once.
#pragma once
static __device__ __forceinline__ void cudaGridDependencySynchronize(void) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}
static __device__ __forceinline__ void cudaTriggerProgrammaticLaunchCompletion(void) {
    asm volatile("griddepcontrol.launch_dependents;" :::);
}
