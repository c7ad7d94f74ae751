//! Device plumbing: context, stream, cuBLAS handle, the NVRTC module cache,
//! device and pinned buffers, captured graphs.

use crate::error::CudaError;
use crate::{cu, kernels, kv, mixed, quant};
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result as drv, sys as drv_sys, CudaContext, CudaStream};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// Whether the CUDA driver, NVRTC and cuBLAS libraries can be loaded and a
/// device is present: `Ok(device count)` or why not. Never panics.
pub fn cuda_available() -> Result<usize, String> {
    device_count().map_err(|e| e.to_string())
}

/// [`cuda_available`] with a typed error: `Unsupported` when a library or
/// a device is missing, `Driver` when the driver fails.
fn device_count() -> Result<usize, CudaError> {
    // SAFETY: these only try to open the shared libraries; nothing is called through them.
    let (d, n, b) = unsafe {
        (
            drv_sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            blas_sys::is_culib_present(),
        )
    };
    let missing: Vec<&str> = [(d, "libcuda"), (n, "libnvrtc"), (b, "libcublas")]
        .iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, name)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(CudaError::Unsupported(format!(
            "CUDA libraries not found: {}",
            missing.join(", ")
        )));
    }
    drv::init().map_err(|e| CudaError::driver("cuInit", e))?;
    let n = drv::device::get_count().map_err(|e| CudaError::driver("cuDeviceGetCount", e))?;
    if n <= 0 {
        return Err(CudaError::Unsupported("no CUDA device".into()));
    }
    Ok(n as usize)
}

/// An NVRTC failure of `module`, with the compiler's log when there is one.
fn nvrtc_err(module: &str, e: cudarc::nvrtc::CompileError) -> CudaError {
    let log = match &e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        e => format!("{e:?}"),
    };
    CudaError::Nvrtc {
        module: module.to_string(),
        log,
    }
}

/// Serializes stream capture against calls that synchronize the device
/// (allocation, free, handle creation): such a call from another thread
/// would invalidate a capture in progress.
static DEVICE_LOCK: Mutex<()> = Mutex::new(());

/// Take [`DEVICE_LOCK`] (a poisoned lock is still a lock).
pub(crate) fn device_lock() -> std::sync::MutexGuard<'static, ()> {
    DEVICE_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every NVRTC module: its name, its CUDA C file (`cu/`, before
/// [`cu::expand`]) and the kernels it exports.
const MODULES: &[(&str, &str, &[&str])] = &[
    ("kernels", cu::KERNELS_CU, kernels::KERNELS),
    ("quant", cu::QUANT_CU, quant::KERNELS),
    ("kv", cu::KV_CU, kv::KERNELS),
    ("mixed", cu::MIXED_CU, mixed::KERNELS),
];

/// Prepended to every module: `RLX_GRID_DEP()` opens each kernel (see
/// [`with_grid_dep`]; the macros are in `cu/grid_dep.cuh`). Waiting before
/// the first global load or store keeps programmatic dependent launch
/// exact: nothing is read before its producer is done, and nothing is
/// overwritten while an earlier kernel may still read it.
const GRID_DEP_PRELUDE: &str = cu::GRID_DEP_CUH;

/// `source` with [`GRID_DEP_PRELUDE`] and `RLX_GRID_DEP();` as the first
/// statement of every `__global__` function (inserted after the body's
/// opening brace, on the same line, so kernels defined in macros keep
/// their line continuations). A kernel marked `RLX_OWN_GRID_DEP` in its
/// signature places `RLX_GRID_LAUNCH()` and `RLX_GRID_WAIT()` itself (to
/// load weights before the wait); it must wait before any other global
/// access.
pub(crate) fn with_grid_dep(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + 4096);
    out.push_str(GRID_DEP_PRELUDE);
    let mut rest = source;
    while let Some(at) = rest.find("__global__") {
        let Some(open) = rest[at..].find('{') else {
            break;
        };
        let cut = at + open + 1;
        out.push_str(&rest[..cut]);
        if !rest[at..cut].contains("RLX_OWN_GRID_DEP") {
            out.push_str(" RLX_GRID_DEP();");
        }
        rest = &rest[cut..];
    }
    out.push_str(rest);
    out
}

/// PTX images by (module index, compute capability).
type PtxCache = Mutex<HashMap<(usize, (i32, i32)), Arc<CString>>>;

/// PTX of module `index` per compute capability, compiled once per process.
fn ptx_for(index: usize, cc: (i32, i32)) -> Result<Arc<CString>, CudaError> {
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut guard = cache
        .lock()
        .map_err(|_| CudaError::driver("PTX cache", "poisoned"))?;
    if let Some(p) = guard.get(&(index, cc)) {
        return Ok(p.clone());
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)],
        ..Default::default()
    };
    let ptx =
        cudarc::nvrtc::compile_ptx_with_opts(with_grid_dep(&cu::expand(MODULES[index].1)), opts)
            .map_err(|e| nvrtc_err(MODULES[index].0, e))?;
    let c = CString::new(ptx.to_src()).map_err(|_| CudaError::Nvrtc {
        module: MODULES[index].0.to_string(),
        log: "PTX holds a NUL byte".into(),
    })?;
    let c = Arc::new(c);
    guard.insert((index, cc), c.clone());
    Ok(c)
}

/// The kernels of one device, loaded once per process (with the context
/// they belong to, which the cache keeps alive).
struct Loaded {
    ctx: Arc<CudaContext>,
    funcs: HashMap<&'static str, FuncHandle>,
}

/// A loaded kernel.
#[derive(Clone, Copy)]
struct FuncHandle(drv_sys::CUfunction);

// SAFETY: a CUfunction is an immutable handle into a module that is never
// unloaded (the cache lives for the whole process); launching it from any
// thread with its context bound is allowed by the driver API.
unsafe impl Send for FuncHandle {}
// SAFETY: as above.
unsafe impl Sync for FuncHandle {}

/// Contexts and modules per device ordinal.
type ModuleCache = Mutex<HashMap<usize, Arc<Loaded>>>;

fn loaded(ordinal: usize) -> Result<Arc<Loaded>, CudaError> {
    static CACHE: OnceLock<ModuleCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut guard = cache
        .lock()
        .map_err(|_| CudaError::driver("module cache", "poisoned"))?;
    if let Some(l) = guard.get(&ordinal) {
        return Ok(l.clone());
    }
    let _lock = device_lock();
    let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::driver("context", e))?;
    // SAFETY: this backend addresses memory by raw pointers on one stream and
    // orders all work on it; cudarc's per-slice events are not needed, and
    // they would break stream capture.
    unsafe { ctx.disable_event_tracking() };
    let cc = ctx
        .compute_capability()
        .map_err(|e| CudaError::driver("compute capability", e))?;
    ctx.bind_to_thread()
        .map_err(|e| CudaError::driver("bind", e))?;
    let mut funcs = HashMap::new();
    for (index, &(_, _, names)) in MODULES.iter().enumerate() {
        let ptx = ptx_for(index, cc)?;
        // SAFETY: `ptx` is a NUL-terminated PTX image that outlives the call. The
        // module is never unloaded: the cache keeps it for the process.
        let module = unsafe { drv::module::load_data(ptx.as_ptr() as *const c_void) }
            .map_err(|e| CudaError::driver("load module", e))?;
        for &name in names {
            let cname = CString::new(name)
                .map_err(|_| CudaError::Unsupported(format!("kernel name {name:?}")))?;
            // SAFETY: `module` was just loaded and is valid.
            let f = unsafe { drv::module::get_function(module, cname) }
                .map_err(|e| CudaError::driver(&format!("kernel {name}"), e))?;
            if mixed::needs_dynamic_smem(name) && cc.0 >= 8 {
                // SAFETY: `f` was just loaded; the attribute only raises the
                // kernel's dynamic shared memory limit (sm_80+ allow 99 KB).
                unsafe {
                    drv::function::set_function_attribute(
                        f,
                        drv_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        mixed::GEMM_PF_SMEM_MAX as i32,
                    )
                }
                .map_err(|e| CudaError::driver(&format!("shared memory limit of {name}"), e))?;
            }
            funcs.insert(name, FuncHandle(f));
        }
    }
    let l = Arc::new(Loaded { ctx, funcs });
    guard.insert(ordinal, l.clone());
    Ok(l)
}

/// A generated kernel `name` in `source`, compiled by NVRTC for the
/// device and loaded once per process (cached by device and name; names
/// are derived from the source).
pub(crate) fn dynamic_function(
    gpu: &Gpu,
    name: &str,
    source: &str,
) -> Result<drv_sys::CUfunction, CudaError> {
    type DynCache = Mutex<HashMap<(usize, String), FuncHandle>>;
    static CACHE: OnceLock<DynCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut guard = cache.lock().unwrap_or_else(|p| p.into_inner());
    let key = (gpu.ctx.ordinal(), name.to_string());
    if let Some(f) = guard.get(&key) {
        return Ok(f.0);
    }
    let cc = gpu
        .ctx
        .compute_capability()
        .map_err(|e| CudaError::driver("compute capability", e))?;
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(with_grid_dep(source), opts)
        .map_err(|e| nvrtc_err(name, e))?;
    let ptx = CString::new(ptx.to_src()).map_err(|_| CudaError::Nvrtc {
        module: name.to_string(),
        log: "PTX holds a NUL byte".into(),
    })?;
    gpu.bind()?;
    let _lock = device_lock();
    // SAFETY: `ptx` is a NUL-terminated PTX image that outlives the call; the
    // module is never unloaded (its functions are cached for the process).
    let module = unsafe { drv::module::load_data(ptx.as_ptr() as *const c_void) }
        .map_err(|e| CudaError::driver("load generated module", e))?;
    let cname =
        CString::new(name).map_err(|_| CudaError::Unsupported(format!("kernel name {name:?}")))?;
    // SAFETY: `module` was just loaded and is valid.
    let f = unsafe { drv::module::get_function(module, cname) }
        .map_err(|e| CudaError::driver(&format!("kernel {name}"), e))?;
    guard.insert(key, FuncHandle(f));
    Ok(f)
}

/// One device's execution resources for one model.
pub(crate) struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) blas: blas_sys::cublasHandle_t,
    kernels: Arc<Loaded>,
    workspace: DeviceBuffer,
    /// Launch rlx kernels with programmatic stream serialization (compute
    /// capability 9.0+ and asked for): see [`GRID_DEP_PRELUDE`].
    pub(crate) grid_dep: bool,
    /// The device's compute capability.
    pub(crate) cc: (i32, i32),
}

// SAFETY: the cuBLAS handle is only used through `&mut CudaModel`, one
// thread at a time, after binding the context.
unsafe impl Send for Gpu {}

/// Bytes of cuBLAS workspace (fixed so that gemms can be captured into graphs).
const WORKSPACE: usize = 32 << 20;

impl Gpu {
    /// Open `ordinal`, load the kernels (once per process), create a stream
    /// and a cuBLAS handle. `grid_dep` asks for programmatic dependent
    /// launch, used where the device supports it (9.0+).
    pub(crate) fn new(ordinal: usize, grid_dep: bool) -> Result<Gpu, CudaError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::Unsupported(format!(
                "cuda:{ordinal}: only {count} device(s)"
            )));
        }
        let kernels = loaded(ordinal)?;
        let ctx = kernels.ctx.clone();
        let cc = ctx
            .compute_capability()
            .map_err(|e| CudaError::driver("compute capability", e))?;
        // Allocate before taking the lock: `DeviceBuffer::new` takes it too.
        let workspace = DeviceBuffer::new(&ctx, WORKSPACE)?;
        let _lock = device_lock();
        let stream = ctx
            .new_stream()
            .map_err(|e| CudaError::driver("stream", e))?;
        let handle = blas::create_handle().map_err(|e| CudaError::cublas("cublas handle", e))?;
        // SAFETY: handle, stream and workspace are valid; the workspace lives as long as the handle.
        unsafe {
            blas::set_stream(handle, stream.cu_stream() as blas_sys::cudaStream_t)
                .map_err(|e| CudaError::cublas("cublas stream", e))?;
            blas_sys::cublasSetWorkspace_v2(handle, workspace.ptr as *mut c_void, WORKSPACE)
                .result()
                .map_err(|e| CudaError::cublas("cublas workspace", e))?;
        }
        Ok(Gpu {
            ctx,
            stream,
            blas: handle,
            kernels,
            workspace,
            grid_dep: grid_dep && cc.0 >= 9,
            cc,
        })
    }

    /// The loaded kernel `name`.
    pub(crate) fn func(&self, name: &str) -> Result<drv_sys::CUfunction, CudaError> {
        self.kernels.funcs.get(name).map(|f| f.0).ok_or_else(|| {
            CudaError::Unsupported(format!("cuda: kernel {name} is not in the module"))
        })
    }

    /// The cuBLAS workspace (address, bytes), shared by cuBLAS and cuBLASLt
    /// calls on this stream.
    pub(crate) fn workspace(&self) -> (u64, usize) {
        (self.workspace.ptr, WORKSPACE)
    }

    /// Make the context current on this thread.
    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))
    }

    /// Wait for all work on the stream.
    pub(crate) fn sync(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(|e| CudaError::driver("synchronize", e))
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
        let _lock = device_lock();
        // SAFETY: the handle was created by `new` and is destroyed once.
        unsafe {
            let _ = blas::destroy_handle(self.blas);
        }
    }
}

/// A plain device allocation (cuMemAlloc), freed on drop.
pub(crate) struct DeviceBuffer {
    pub(crate) ptr: drv_sys::CUdeviceptr,
    pub(crate) bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    /// Allocate `bytes` (at least 256).
    pub(crate) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        ctx.bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        let n = bytes.max(256);
        let _lock = device_lock();
        // SAFETY: a plain allocation of `n` bytes in the bound context.
        let ptr = unsafe { drv::malloc_sync(n) }.map_err(|e| {
            // The context is bound (above), so the driver can say what is free.
            CudaError::alloc("alloc", n, e, || {
                drv::mem_get_info().map_or(0, |(free, _)| free)
            })
        })?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: ctx.clone(),
        })
    }

    /// Copy `data` into the start of the buffer, synchronously.
    pub(crate) fn upload(&self, data: &[u8]) -> Result<(), CudaError> {
        if data.len() > self.bytes.max(256) {
            return Err(CudaError::Unsupported(format!(
                "cuda: upload of {} bytes into {} bytes",
                data.len(),
                self.bytes
            )));
        }
        if data.is_empty() {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        let _lock = device_lock();
        // SAFETY: the destination holds at least `data.len()` bytes (checked above).
        unsafe { drv::memcpy_htod_sync(self.ptr, data) }
            .map_err(|e| CudaError::driver("upload", e))?;
        // From pageable memory the copy returns once `data` is staged, before
        // the DMA into the buffer is done, and runs on the legacy stream, which
        // the executor's non-blocking stream does not wait for: without this a
        // kernel could read the buffer's old (fresh: zero) bytes.
        self.ctx
            .synchronize()
            .map_err(|e| CudaError::driver("synchronize", e))
    }
}

impl DeviceBuffer {
    /// Allocate `bytes` (at least 256) and set every byte to zero.
    pub(crate) fn zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        let b = DeviceBuffer::new(ctx, bytes)?;
        let _lock = device_lock();
        // SAFETY: the allocation holds at least `bytes.max(256)` bytes; the
        // context was bound by `new`.
        unsafe { drv::memset_d8_sync(b.ptr, 0, bytes.max(256)) }
            .map_err(|e| CudaError::driver("memset", e))?;
        ctx.synchronize()
            .map_err(|e| CudaError::driver("synchronize", e))?;
        Ok(b)
    }

    /// The context the buffer was allocated in.
    pub(crate) fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Copy the start of the buffer into `out`, synchronously (after all
    /// work queued in the context).
    pub(crate) fn download(&self, out: &mut [u8]) -> Result<(), CudaError> {
        if out.len() > self.bytes.max(256) {
            return Err(CudaError::Unsupported(format!(
                "cuda: download of {} bytes from {} bytes",
                out.len(),
                self.bytes
            )));
        }
        if out.is_empty() {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        self.ctx
            .synchronize()
            .map_err(|e| CudaError::driver("synchronize", e))?;
        let _lock = device_lock();
        // SAFETY: the source holds at least `out.len()` bytes (checked above).
        unsafe { drv::memcpy_dtoh_sync(out, self.ptr) }
            .map_err(|e| CudaError::driver("download", e))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _lock = device_lock();
        // SAFETY: `ptr` came from `malloc_sync` and is freed once; the context
        // synchronizes before freeing device memory that work may still use.
        unsafe {
            let _ = drv::free_sync(self.ptr);
        }
    }
}

/// Page-locked host memory, for asynchronous copies.
pub(crate) struct Pinned {
    ptr: *mut u8,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer is plain host memory owned by this value.
unsafe impl Send for Pinned {}

impl Pinned {
    pub(crate) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Pinned, CudaError> {
        ctx.bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        let n = bytes.max(64);
        let _lock = device_lock();
        // SAFETY: allocates `n` bytes of page-locked host memory.
        let ptr = unsafe { drv::malloc_host(n, 0) }
            .map_err(|e| CudaError::driver("pinned alloc", e))? as *mut u8;
        Ok(Pinned {
            ptr,
            bytes: n,
            ctx: ctx.clone(),
        })
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `bytes` bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    /// The buffer's address, for copies the device makes into it.
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _lock = device_lock();
        // SAFETY: `ptr` came from `malloc_host` and is freed once.
        unsafe {
            let _ = drv::free_host(self.ptr as *mut c_void);
        }
    }
}

/// An instantiated CUDA graph.
pub(crate) struct Graph {
    graph: drv_sys::CUgraph,
    exec: drv_sys::CUgraphExec,
    /// Kernel and copy nodes captured.
    pub(crate) nodes: usize,
}

// SAFETY: graphs are launched only through `&mut CudaModel`, one thread at a time.
unsafe impl Send for Graph {}

impl Graph {
    /// Capture what `issue` enqueues on the stream and instantiate it.
    pub(crate) fn capture(
        gpu: &Gpu,
        nodes: usize,
        issue: impl FnOnce() -> Result<(), CudaError>,
    ) -> Result<Graph, CudaError> {
        gpu.bind()?;
        let _lock = device_lock();
        let s = gpu.stream.cu_stream();
        // SAFETY: the stream is valid and idle (callers synchronize first).
        unsafe {
            drv::stream::begin_capture(
                s,
                drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| CudaError::driver("begin capture", e))?;
        let issued = issue();
        // SAFETY: ends the capture begun above, also when issuing failed.
        let graph = unsafe { drv::stream::end_capture(s) };
        issued?;
        let graph = graph.map_err(|e| CudaError::driver("end capture", e))?;
        if graph.is_null() {
            return Err(CudaError::driver("end capture", "no graph"));
        }
        let mut exec: drv_sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph` is a valid captured graph; `exec` receives the instance.
        let r = unsafe { drv_sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result();
        if let Err(e) = r {
            // SAFETY: destroys the graph created above.
            unsafe {
                let _ = drv::graph::destroy(graph);
            }
            return Err(CudaError::driver("instantiate graph", e));
        }
        Ok(Graph { graph, exec, nodes })
    }

    /// Replay on the stream.
    pub(crate) fn launch(&self, gpu: &Gpu) -> Result<(), CudaError> {
        // SAFETY: `exec` is a valid instance; the stream is valid.
        unsafe { drv::graph::launch(self.exec, gpu.stream.cu_stream()) }
            .map_err(|e| CudaError::driver("graph launch", e))
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both handles were created in `capture` and are destroyed once.
        unsafe {
            let _ = drv::graph::exec_destroy(self.exec);
            let _ = drv::graph::destroy(self.graph);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grid-dependency wait opens every kernel once, on the line of its
    /// opening brace (so a kernel defined in a macro keeps its line
    /// continuations), and a kernel marked `RLX_OWN_GRID_DEP` is left alone.
    #[test]
    fn every_kernel_opens_with_the_grid_dependency_wait() {
        let src = "__device__ int f(int x) { return x; }\n\
                   extern \"C\" __global__ void a(float* o) { o[0] = 1.0f; }\n\
                   #define K(NAME) \\\n__global__ void NAME(float* o) { \\\n o[0] = 2.0f; }\n\
                   K(b)\n\
                   __global__ void RLX_OWN_GRID_DEP c(float* o) { RLX_GRID_WAIT(); o[0] = 3.0f; }\n";
        let out = with_grid_dep(src);
        assert!(out.starts_with(GRID_DEP_PRELUDE));
        let body = &out[GRID_DEP_PRELUDE.len()..];
        assert_eq!(body.matches("RLX_GRID_DEP();").count(), 2, "{body}");
        assert!(body.contains("void a(float* o) { RLX_GRID_DEP(); o[0] = 1.0f; }"));
        assert!(body.contains("void NAME(float* o) { RLX_GRID_DEP(); \\\n o[0] = 2.0f; }"));
        assert!(body.contains("int f(int x) { return x; }"));
        assert!(body.contains("c(float* o) { RLX_GRID_WAIT(); o[0] = 3.0f; }"));
    }

    /// On 9.0 the small-matmul kernel lets the next kernel launch first,
    /// issues its weight copies before the grid-dependency wait (that is
    /// its point), and its activation copies after it.
    #[test]
    fn small_matmul_loads_weights_before_the_wait() {
        // SAFETY: only tries to open the shared library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            println!("skipped: libnvrtc not found (scripts/test.sh installs it)");
            return;
        }
        let i = MODULES.iter().position(|m| m.0 == "mixed").unwrap();
        let ptx = ptx_for(i, (9, 0)).unwrap();
        let ptx = ptx.to_str().unwrap();
        for k in ["gemm_pf_bf16_16", "gemm_pf_f16_64"] {
            let at = ptx.find(&format!(".entry {k}(")).unwrap();
            let body = &ptx[at..];
            let body = &body[..body[1..].find(".entry ").map_or(body.len(), |e| e + 1)];
            let pos = |what: &str| body.find(what).unwrap_or_else(|| panic!("{k}: no {what}"));
            let wait = pos("griddepcontrol.wait");
            assert!(
                pos("griddepcontrol.launch_dependents") < pos("cp.async"),
                "{k}"
            );
            assert!(pos("cp.async") < wait, "{k}: no copy before the wait");
            assert!(
                body[wait..].contains("cp.async.ca") || body[wait..].contains("cp.async.cg"),
                "{k}"
            );
        }
    }

    /// Every NVRTC module compiles for compute capabilities 7.5 (the
    /// CUDA-core fallbacks), 8.0 and 9.0, and its PTX defines every kernel
    /// it lists, wherever libnvrtc can be loaded: no device is needed, so a
    /// kernel that does not compile fails here and not only on a GPU
    /// machine (scripts/test.sh puts NVRTC from PyPI on the library path).
    #[test]
    fn every_kernel_module_compiles_with_nvrtc() {
        // SAFETY: only tries to open the shared library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            println!("skipped: libnvrtc not found (scripts/test.sh installs it)");
            return;
        }
        for (i, (_, _, kernels)) in MODULES.iter().enumerate() {
            for cc in [(7, 5), (8, 0), (9, 0)] {
                let ptx = ptx_for(i, cc).unwrap_or_else(|e| panic!("sm_{}{}: {e}", cc.0, cc.1));
                let ptx = ptx.to_str().expect("PTX is ASCII");
                // Every kernel opens with the grid-dependency wait on 9.0+.
                let waits = ptx.matches("griddepcontrol.wait").count();
                let want = if cc.0 >= 9 {
                    ptx.matches(".entry ").count()
                } else {
                    0
                };
                assert_eq!(
                    waits, want,
                    "module {i} sm_{}{}: grid-dependency waits",
                    cc.0, cc.1
                );
                for k in kernels.iter() {
                    assert!(
                        ptx.contains(&format!(".entry {k}(")),
                        "module {i} (sm_{}{}) does not define kernel {k}",
                        cc.0,
                        cc.1
                    );
                }
            }
        }
    }
}
