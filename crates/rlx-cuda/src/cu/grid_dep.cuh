// Programmatic dependent launch. rlx-cuda prepends this file to every kernel
// module and opens every kernel with `RLX_GRID_DEP();` (see
// `device::with_grid_dep`). On compute capability 9.0+ it lets the next kernel
// launch now (its blocks take free SMs and wait), then waits until every grid
// this one depends on has finished and its writes are visible. A kernel marked
// `RLX_OWN_GRID_DEP` places `RLX_GRID_LAUNCH()` and `RLX_GRID_WAIT()` itself.
// Without the launch attribute, or below 9.0, both are no-ops.
#ifndef RLX_GRID_DEP_CUH
#define RLX_GRID_DEP_CUH
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RLX_GRID_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define RLX_GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define RLX_GRID_LAUNCH()
#define RLX_GRID_WAIT()
#endif
#define RLX_GRID_DEP() RLX_GRID_LAUNCH(); RLX_GRID_WAIT()
#define RLX_OWN_GRID_DEP
#endif // RLX_GRID_DEP_CUH
