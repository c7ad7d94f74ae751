//! Matmuls through cuBLASLt (with its bias / ReLU / GELU epilogues and a
//! heuristic-chosen algorithm, planned once per gemm), and the fallback
//! `cublasGemmStridedBatchedEx` for what cuBLASLt declines.
//!
//! A [`Gemm`] is column-major: `C[m, n] = op(A)[m, k] B[k, n]` where `A` is
//! the row-major right operand (a weight, `transposed` when stored
//! `[out, in]`) and `B` the row-major left operand. The epilogue bias has
//! one value per row of `C` (per output feature).

use crate::device::Gpu;
use crate::error::CudaError;
use crate::launch::{Epi, Gemm};
use crate::store::Dt;
use cudarc::cublas::sys as blas_sys;
use cudarc::cublaslt::{result as lt, sys as lt_sys};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

/// Algorithms the heuristic proposes per gemm; each is timed once at
/// planning and the fastest kept.
const CANDIDATES: usize = 8;

fn lerr(what: &str, e: impl std::fmt::Debug) -> CudaError {
    CudaError::cublas(&format!("cublasLt {what}"), e)
}

/// The process-wide cuBLASLt handle of each device (never destroyed), or
/// `None` when libcublasLt cannot be loaded.
fn handle(gpu: &Gpu) -> Result<Option<lt_sys::cublasLtHandle_t>, CudaError> {
    static HANDLES: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    // SAFETY: only tries to open the shared library.
    if !unsafe { lt_sys::is_culib_present() } {
        return Ok(None);
    }
    let map = HANDLES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut guard = map.lock().unwrap_or_else(|p| p.into_inner());
    let ordinal = gpu.ctx.ordinal();
    if let Some(&h) = guard.get(&ordinal) {
        return Ok(Some(h as lt_sys::cublasLtHandle_t));
    }
    gpu.bind()?;
    let _lock = crate::device::device_lock();
    let h = lt::create_handle().map_err(|e| lerr("create handle", e))?;
    guard.insert(ordinal, h as usize);
    Ok(Some(h))
}

fn lt_type(dt: Dt) -> lt_sys::cudaDataType {
    match dt {
        Dt::F32 => lt_sys::cudaDataType::CUDA_R_32F,
        Dt::Bf16 => lt_sys::cudaDataType::CUDA_R_16BF,
        Dt::F16 => lt_sys::cudaDataType::CUDA_R_16F,
    }
}

fn blas_type(dt: Dt) -> blas_sys::cudaDataType {
    match dt {
        Dt::F32 => blas_sys::cudaDataType::CUDA_R_32F,
        Dt::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
        Dt::F16 => blas_sys::cudaDataType::CUDA_R_16F,
    }
}

/// One planned cuBLASLt matmul: descriptors, layouts and algorithm.
pub(crate) struct LtMatmul {
    handle: lt_sys::cublasLtHandle_t,
    desc: lt_sys::cublasLtMatmulDesc_t,
    layouts: [lt_sys::cublasLtMatrixLayout_t; 3],
    algo: lt_sys::cublasLtMatmulAlgo_t,
    g: Gemm,
    workspace: (u64, usize),
}

// SAFETY: the descriptors are plain host objects owned by this value and
// used through `&mut CudaModel`, one thread at a time.
unsafe impl Send for LtMatmul {}

/// Owns descriptors until they are moved into an [`LtMatmul`].
struct Parts {
    desc: Option<lt_sys::cublasLtMatmulDesc_t>,
    layouts: Vec<lt_sys::cublasLtMatrixLayout_t>,
    pref: Option<lt_sys::cublasLtMatmulPreference_t>,
}

impl Drop for Parts {
    fn drop(&mut self) {
        // SAFETY: each handle was created by cuBLASLt and is destroyed once
        // (taken out of `self` when ownership moves to an `LtMatmul`).
        unsafe {
            if let Some(d) = self.desc.take() {
                let _ = lt::destroy_matmul_desc(d);
            }
            for l in self.layouts.drain(..) {
                let _ = lt::destroy_matrix_layout(l);
            }
            if let Some(p) = self.pref.take() {
                let _ = lt::destroy_matmul_pref(p);
            }
        }
    }
}

fn set_desc<T>(
    desc: lt_sys::cublasLtMatmulDesc_t,
    attr: lt_sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<(), CudaError> {
    // SAFETY: `v` is a live value of the attribute's documented type and size.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            v as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
    .map_err(|e| lerr(&format!("{attr:?}"), e))
}

fn layout(
    dt: Dt,
    rows: i32,
    cols: i32,
    ld: i32,
    batch: i32,
    stride: i64,
) -> Result<lt_sys::cublasLtMatrixLayout_t, CudaError> {
    let l = lt::create_matrix_layout(lt_type(dt), rows as u64, cols as u64, ld as i64)
        .map_err(|e| lerr("layout", e))?;
    if batch > 1 {
        for (attr, ptr, size) in [
            (
                lt_sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                &batch as *const i32 as *const c_void,
                4,
            ),
            (
                lt_sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                &stride as *const i64 as *const c_void,
                8,
            ),
        ] {
            // SAFETY: `l` was just created; `ptr` addresses `size` bytes of the attribute's type.
            if let Err(e) = unsafe { lt::set_matrix_layout_attribute(l, attr, ptr, size) } {
                // SAFETY: destroys the layout created above, once.
                unsafe {
                    let _ = lt::destroy_matrix_layout(l);
                }
                return Err(lerr("layout batch", e));
            }
        }
    }
    Ok(l)
}

impl LtMatmul {
    /// Plan `g` with cuBLASLt; `Ok(None)` when the library is missing or
    /// declines the problem (the caller falls back to [`gemm_ex`]).
    pub(crate) fn plan(gpu: &Gpu, g: &Gemm) -> Result<Option<LtMatmul>, CudaError> {
        let Some(handle) = handle(gpu)? else {
            return Ok(None);
        };
        let compute = if g.tf32 {
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let mut parts = Parts {
            desc: None,
            layouts: Vec::new(),
            pref: None,
        };
        let desc = lt::create_matmul_desc(compute, lt_sys::cudaDataType::CUDA_R_32F)
            .map_err(|e| lerr("matmul desc", e))?;
        parts.desc = Some(desc);
        let op = if g.ta {
            blas_sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            blas_sys::cublasOperation_t::CUBLAS_OP_N
        };
        set_desc(
            desc,
            lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &op,
        )?;
        let epi = match g.epi {
            Epi::None => None,
            Epi::Bias => Some(lt_sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS),
            Epi::ReluBias => Some(lt_sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS),
            Epi::GeluBias => Some(lt_sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS),
        };
        if let Some(e) = epi {
            set_desc(
                desc,
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                &e,
            )?;
            let ptr = g.bias as *const c_void;
            set_desc(
                desc,
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &ptr,
            )?;
            let bt = lt_type(g.bias_dt);
            set_desc(
                desc,
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                &bt,
            )?;
        }
        let (ar, ac) = if g.ta { (g.k, g.m) } else { (g.m, g.k) };
        parts
            .layouts
            .push(layout(g.dt[0], ar, ac, g.lda, g.batch, g.sa)?);
        parts
            .layouts
            .push(layout(g.dt[1], g.k, g.n, g.ldb, g.batch, g.sb)?);
        parts
            .layouts
            .push(layout(g.dt[2], g.m, g.n, g.ldc, g.batch, g.sc)?);
        let pref = lt::create_matmul_pref().map_err(|e| lerr("preference", e))?;
        parts.pref = Some(pref);
        let workspace = gpu.workspace();
        let ws = workspace.1 as u64;
        // SAFETY: `pref` is live; the value is a u64 as documented.
        unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            )
        }
        .map_err(|e| lerr("preference workspace", e))?;
        let [la, lb, lc] = [parts.layouts[0], parts.layouts[1], parts.layouts[2]];
        // SAFETY: a zeroed heuristic result is a valid bit pattern (plain data).
        let mut found: [lt_sys::cublasLtMatmulHeuristicResult_t; CANDIDATES] =
            unsafe { std::mem::zeroed() };
        let mut count = 0i32;
        // SAFETY: every descriptor is live; the query writes at most
        // `CANDIDATES` results into `found` and their number into `count`.
        let r = unsafe {
            lt_sys::cublasLtMatmulAlgoGetHeuristic(
                handle,
                desc,
                la,
                lb,
                lc,
                lc,
                pref,
                CANDIDATES as i32,
                found.as_mut_ptr(),
                &mut count,
            )
        };
        let algos: Vec<lt_sys::cublasLtMatmulAlgo_t> = found
            [..count.clamp(0, CANDIDATES as i32) as usize]
            .iter()
            .filter(|h| h.state == lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .filter(|h| h.workspaceSize <= workspace.1)
            .map(|h| h.algo)
            .collect();
        if r != lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS || algos.is_empty() {
            return Ok(None);
        }
        let mut m = LtMatmul {
            handle,
            desc,
            layouts: [la, lb, lc],
            algo: algos[0],
            g: *g,
            workspace,
        };
        parts.desc = None;
        parts.layouts.clear();
        if algos.len() > 1 {
            m.algo = m.fastest(gpu, &algos)?;
        }
        Ok(Some(m))
    }

    /// Time each candidate algorithm on the real operands (the output slot
    /// is overwritten before any run reads it) and return the fastest; the
    /// heuristic's first choice wins ties and whatever fails to run. Each
    /// candidate runs as a captured CUDA graph of `REPS` matmuls, as it will
    /// in a compiled segment: eager launches of a small matmul would time
    /// the launch cost (about 3.6 us) rather than the kernel.
    fn fastest(
        &mut self,
        gpu: &Gpu,
        algos: &[lt_sys::cublasLtMatmulAlgo_t],
    ) -> Result<lt_sys::cublasLtMatmulAlgo_t, CudaError> {
        const REPS: usize = 8;
        const ROUNDS: usize = 3;
        let mut graphs = Vec::with_capacity(algos.len());
        for &a in algos {
            self.algo = a;
            if self.issue(gpu).and_then(|_| gpu.sync()).is_err() {
                continue;
            }
            let me = &*self;
            let Ok(g) = crate::device::Graph::capture(gpu, REPS, || {
                (0..REPS).try_for_each(|_| me.issue(gpu))
            }) else {
                let _ = gpu.sync();
                continue;
            };
            graphs.push((a, g, f64::INFINITY));
        }
        // Interleaved rounds, each candidate's best round counts: a noisy
        // moment does not decide.
        for _ in 0..ROUNDS {
            for (_, g, best) in graphs.iter_mut() {
                g.launch(gpu)?;
                gpu.sync()?;
                let t = std::time::Instant::now();
                g.launch(gpu)?;
                g.launch(gpu)?;
                gpu.sync()?;
                *best = best.min(t.elapsed().as_secs_f64());
            }
        }
        let mut best = (f64::INFINITY, algos[0]);
        for (a, _, t) in graphs {
            if t < best.0 * 0.97 {
                best = (t, a);
            }
        }
        Ok(best.1)
    }

    /// Enqueue on the stream.
    pub(crate) fn issue(&self, gpu: &Gpu) -> Result<(), CudaError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let g = &self.g;
        // SAFETY: the descriptors are live; the operand addresses were lowered
        // from live device buffers with the sizes the layouts describe; alpha and
        // beta are host scalars read during the call; the workspace belongs to
        // this model's stream.
        unsafe {
            lt::matmul(
                self.handle,
                self.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                g.a as *const c_void,
                self.layouts[0],
                g.b as *const c_void,
                self.layouts[1],
                g.c as *const c_void,
                self.layouts[2],
                g.c as *mut c_void,
                self.layouts[2],
                &self.algo,
                self.workspace.0 as *mut c_void,
                self.workspace.1,
                gpu.stream.cu_stream() as lt_sys::cudaStream_t,
            )
        }
        .map_err(|e| lerr("matmul", e))
    }
}

impl Drop for LtMatmul {
    fn drop(&mut self) {
        // SAFETY: the descriptors were created in `plan` and are destroyed once.
        unsafe {
            let _ = lt::destroy_matmul_desc(self.desc);
            for l in self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
        }
    }
}

/// `g` through `cublasGemmStridedBatchedEx` (no epilogue: the caller adds
/// the bias/activation kernel).
pub(crate) fn gemm_ex(gpu: &Gpu, g: &Gemm) -> Result<(), CudaError> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let compute = if g.tf32 {
        blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
    } else {
        blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
    };
    let ta = if g.ta {
        blas_sys::cublasOperation_t::CUBLAS_OP_T
    } else {
        blas_sys::cublasOperation_t::CUBLAS_OP_N
    };
    // SAFETY: all addresses were lowered from live device buffers with the
    // sizes the gemm reads and writes; alpha/beta are host f32 scalars
    // (compute type 32F).
    unsafe {
        blas_sys::cublasGemmStridedBatchedEx(
            gpu.blas,
            ta,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            g.m,
            g.n,
            g.k,
            &alpha as *const f32 as *const c_void,
            g.a as *const c_void,
            blas_type(g.dt[0]),
            g.lda,
            g.sa,
            g.b as *const c_void,
            blas_type(g.dt[1]),
            g.ldb,
            g.sb,
            &beta as *const f32 as *const c_void,
            g.c as *mut c_void,
            blas_type(g.dt[2]),
            g.ldc,
            g.sc,
            g.batch,
            compute,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .result()
    .map_err(|e| CudaError::cublas("cublasGemmStridedBatchedEx", e))
}
