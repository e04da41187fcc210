//! The fused decode step's products on the folded copy (`x W^T`, a few rows
//! of x, bf16) through cuBLASLt, with each shape's algorithm picked by
//! timing instead of cuBLAS's heuristic (docs/BENCHMARKS.md, "cuBLASLt's
//! algorithm search in the decode step").
//!
//! At the decode shapes cuBLAS's own choice leaves bandwidth unused where
//! the product is small (Qwen3-4B's o projection reaches about a third of
//! the card's bandwidth), and cuBLASLt offers other algorithms (split-K
//! among them) that do better on some shapes and worse on others. So each
//! `(rows, out, in)` shape is timed once: every algorithm cuBLASLt's
//! heuristic proposes, and cuBLAS's path as candle calls it, each run over
//! all the step's weights of that shape in turn (as a step reads them, none
//! left in L2), and the fastest is kept.
//!
//! The choice is kept for the process and written to a small file
//! (`$TRACE_TRAIN_CACHE_DIR`, else `$XDG_CACHE_HOME/trace-train`, else
//! `~/.cache/trace-train`), keyed by the GPU's name, cuBLASLt's version and
//! the shape, so that a later run on the same machine (a resumed one
//! included) takes the same algorithm and samples the same bits. An
//! algorithm found there but no longer proposed is timed again.
//! `TRACE_TRAIN_DECODE_LT=off` keeps every product on cuBLAS.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::cublaslt::{result, sys};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use candle_core::{CudaDevice, DType, Device, Result, Tensor, bail};

use crate::cuda::kernels::{ptr, uninit};
use crate::cuda::lt::{lt, proposals};

/// Workspace for split-K algorithms (what cuBLASLt's documentation asks
/// for on Hopper).
const WORKSPACE: usize = 32 << 20;
/// Algorithms asked of the heuristic a shape.
const CANDIDATES: usize = 32;
/// Timed passes over a shape's weights a candidate (after one untimed).
const PASSES: usize = 3;

/// What a shape runs on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Choice {
    /// candle's matmul (cuBLAS's own heuristic).
    Cublas,
    /// This cuBLASLt algorithm.
    Lt(sys::cublasLtMatmulAlgo_t),
}

/// A shape's descriptors and algorithm.
struct Plan {
    rows: usize,
    out: usize,
    inp: usize,
    desc: sys::cublasLtMatmulDesc_t,
    /// W as (in, out) column-major, X as (in, rows), Y as (out, rows).
    w: sys::cublasLtMatrixLayout_t,
    x: sys::cublasLtMatrixLayout_t,
    y: sys::cublasLtMatrixLayout_t,
    choice: Choice,
}

/// cuBLASLt's handle, its workspace and a plan for each product shape of
/// one decode engine (its row count fixed).
pub struct LtProducts {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    plans: Vec<Plan>,
}

// SAFETY: the handle and descriptors are only used from the thread that
// owns the engine, one call at a time; cuBLASLt handles may move between
// threads.
unsafe impl Send for LtProducts {}

impl Drop for LtProducts {
    fn drop(&mut self) {
        // The plans go first (their own Drop), then the handle.
        self.plans.clear();
        // SAFETY: created in `new`, destroyed once here.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each was made by `Plan::new` (or is still null, where it
        // stopped early) and is destroyed once here.
        unsafe {
            for l in [self.w, self.x, self.y] {
                if !l.is_null() {
                    let _ = result::destroy_matrix_layout(l);
                }
            }
            if !self.desc.is_null() {
                let _ = result::destroy_matmul_desc(self.desc);
            }
        }
    }
}

impl Plan {
    fn new(rows: usize, out: usize, inp: usize) -> Result<Self> {
        use sys::cudaDataType::CUDA_R_16BF;
        // Filled in one descriptor at a time, so that an error drops what
        // was made before it.
        let mut plan = Self {
            rows,
            out,
            inp,
            desc: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            choice: Choice::Cublas,
        };
        plan.desc = lt(
            "matmul descriptor",
            result::create_matmul_desc(
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType::CUDA_R_32F,
            ),
        )?;
        let transpose: i32 = 1;
        // SAFETY: desc was just created; the attribute is an i32.
        lt("transpose", unsafe {
            result::set_matmul_desc_attribute(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&transpose) as *const i32 as *const _,
                std::mem::size_of::<i32>(),
            )
        })?;
        let layout = |r: usize, c: usize| {
            lt(
                "matrix layout",
                result::create_matrix_layout(CUDA_R_16BF, r as u64, c as u64, r as i64),
            )
        };
        plan.w = layout(inp, out)?;
        plan.x = layout(inp, rows)?;
        plan.y = layout(out, rows)?;
        Ok(plan)
    }
}

/// Whether `TRACE_TRAIN_DECODE_LT` leaves cuBLASLt on (the default).
pub fn enabled() -> Result<bool> {
    match std::env::var("TRACE_TRAIN_DECODE_LT").as_deref() {
        Err(_) | Ok("on") | Ok("") => Ok(true),
        Ok("off") => Ok(false),
        Ok(v) => bail!("TRACE_TRAIN_DECODE_LT=`{v}`: expected `on` or `off`"),
    }
}

/// A product shape on a device: (device ordinal, rows, out, in).
type ShapeKey = (usize, usize, usize, usize);

/// Choices made in this process.
static CHOSEN: Mutex<Vec<(ShapeKey, Choice)>> = Mutex::new(Vec::new());

impl LtProducts {
    /// Plans for the folded bf16 weights `weights` at `rows` rows of x,
    /// each shape's algorithm taken from this process's choices, the
    /// machine's file, or timed now on these weights.
    pub fn new(dev: &CudaDevice, rows: usize, weights: &[&Tensor]) -> Result<Self> {
        Self::with_file(dev, rows, weights, ChoiceFile::for_device(dev)?)
    }

    /// [`LtProducts::new`] with the choices kept in `file`.
    fn with_file(
        dev: &CudaDevice,
        rows: usize,
        weights: &[&Tensor],
        mut file: ChoiceFile,
    ) -> Result<Self> {
        let stream = dev.cuda_stream();
        // cuBLASLt works in the thread's current context: make it this
        // device's (as every cudarc call does for itself).
        stream.context().bind_to_thread().w()?;
        let workspace = dev.alloc_zeros::<u8>(WORKSPACE)?;
        let handle = lt("handle", result::create_handle())?;
        let mut me = Self {
            handle,
            workspace,
            stream,
            plans: Vec::new(),
        };
        let mut shapes: Vec<((usize, usize), Vec<&Tensor>)> = Vec::new();
        for w in weights {
            if w.dtype() != DType::BF16 {
                continue;
            }
            let dims = w.dims2()?;
            match shapes.iter_mut().find(|(d, _)| *d == dims) {
                Some((_, ws)) => ws.push(w),
                None => shapes.push((dims, vec![w])),
            }
        }
        let ordinal = dev.cuda_stream().context().ordinal();
        for ((out, inp), ws) in shapes {
            let mut plan = Plan::new(rows, out, inp)?;
            let key = (ordinal, rows, out, inp);
            let known = CHOSEN
                .lock()
                .unwrap()
                .iter()
                .find(|(k, _)| *k == key)
                .map(|c| c.1);
            plan.choice = match known {
                Some(c) => c,
                None => {
                    let candidates = me.candidates(&plan)?;
                    let c = match file.get(rows, out, inp, &candidates) {
                        Some(c) => c,
                        None => {
                            let c = me.time(dev, &plan, &candidates, &ws)?;
                            file.put(rows, out, inp, c);
                            c
                        }
                    };
                    CHOSEN.lock().unwrap().push((key, c));
                    c
                }
            };
            me.plans.push(plan);
        }
        file.save();
        Ok(me)
    }

    /// `x W^T` by the plan for `w`'s shape at `x`'s rows; `None` where the
    /// plan is cuBLAS's or there is none (the caller multiplies).
    pub fn project(&self, x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
        let (rows, inp) = x.dims2()?;
        let (out, k) = w.dims2()?;
        let Some(plan) = self
            .plans
            .iter()
            .find(|p| (p.rows, p.out, p.inp) == (rows, out, k))
        else {
            return Ok(None);
        };
        let Choice::Lt(algo) = plan.choice else {
            return Ok(None);
        };
        if x.dtype() != DType::BF16 || w.dtype() != DType::BF16 || inp != k {
            bail!("decode product: x ({rows}, {inp}) against a weight ({out}, {k})");
        }
        let Device::Cuda(dev) = x.device() else {
            bail!("decode product: expected a CUDA tensor");
        };
        // The heuristic proposed algorithms for 256-byte aligned operands
        // (its default); a view that starts elsewhere goes to cuBLAS.
        let (wp, xp) = (ptr(w)?, ptr(x)?);
        if wp % 256 != 0 || xp % 256 != 0 {
            return Ok(None);
        }
        // cuBLASLt writes every element (beta 0).
        let y = uninit(dev, DType::BF16, rows, out)?;
        let yp = ptr(&y)?;
        if yp % 256 != 0 {
            return Ok(None);
        }
        self.run(plan, &algo, wp, xp, yp)?;
        Ok(Some(y))
    }

    /// One launch of `plan` with `algo`: y = x w^T.
    fn run(
        &self,
        plan: &Plan,
        algo: &sys::cublasLtMatmulAlgo_t,
        w: u64,
        x: u64,
        y: u64,
    ) -> Result<()> {
        let (alpha, beta) = (1f32, 0f32);
        self.stream.context().bind_to_thread().w()?;
        let ws = self.workspace.device_ptr(&self.stream).0;
        // SAFETY: the descriptors describe w (out, in), x (rows, in) and y
        // (rows, out), all bf16 and contiguous, as `project` and `time`
        // check; the workspace is WORKSPACE bytes; the launch is ordered on
        // the device's stream like every other use of these buffers.
        lt("matmul", unsafe {
            result::matmul(
                self.handle,
                plan.desc,
                (&alpha) as *const f32 as *const _,
                (&beta) as *const f32 as *const _,
                w as *const _,
                plan.w,
                x as *const _,
                plan.x,
                y as *const _,
                plan.y,
                y as *mut _,
                plan.y,
                algo,
                ws as *mut _,
                WORKSPACE,
                self.stream.cu_stream() as sys::cudaStream_t,
            )
        })
    }

    /// The algorithms cuBLASLt's heuristic proposes for `plan`, best first.
    fn candidates(&self, plan: &Plan) -> Result<Vec<sys::cublasLtMatmulAlgo_t>> {
        // SAFETY: the handle and the plan's descriptors are live.
        let proposed = unsafe {
            proposals(
                self.handle,
                plan.desc,
                [plan.w, plan.x, plan.y, plan.y],
                WORKSPACE,
                CANDIDATES,
            )
        }?;
        Ok(proposed.unwrap_or_else(|e| {
            // No algorithm for this shape (NOT_SUPPORTED): cuBLAS keeps it.
            tracing::debug!(
                "decode: cuBLASLt proposes nothing for {} x {}: {e}",
                plan.out,
                plan.inp
            );
            Vec::new()
        }))
    }

    /// The fastest of cuBLAS's path and `candidates` for `plan`, each
    /// timed over `ws` (the step's weights of this shape) in turn.
    fn time(
        &self,
        dev: &CudaDevice,
        plan: &Plan,
        candidates: &[sys::cublasLtMatmulAlgo_t],
        ws: &[&Tensor],
    ) -> Result<Choice> {
        let x = Tensor::ones(
            (plan.rows, plan.inp),
            DType::BF16,
            &Device::Cuda(dev.clone()),
        )?;
        let y = Tensor::zeros((plan.rows, plan.out), DType::BF16, x.device())?;
        let (xp, yp) = (ptr(&x)?, ptr(&y)?);
        let wps: Vec<u64> = ws.iter().map(|w| ptr(w)).collect::<Result<_>>()?;
        // Passes long enough to time: at least 8 launches each.
        let reps = wps.len().max(8);
        let ctx = self.stream.context();
        let timed = |f: &dyn Fn(usize) -> Result<()>| -> Result<f32> {
            for i in 0..reps {
                f(i)?;
            }
            let flags = Some(
                candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT,
            );
            let start = ctx.new_event(flags).w()?;
            let end = ctx.new_event(flags).w()?;
            start.record(&self.stream).w()?;
            for i in 0..PASSES * reps {
                f(i)?;
            }
            end.record(&self.stream).w()?;
            start.elapsed_ms(&end).w()
        };
        let mut best = (
            timed(&|i| {
                ws[i % ws.len()]
                    .contiguous()
                    .and_then(|w| x.matmul(&w.t()?))
                    .map(|_| ())
            })?,
            Choice::Cublas,
        );
        for algo in candidates {
            // An algorithm that fails to launch here is left out.
            if self.run(plan, algo, wps[0], xp, yp).is_err() {
                continue;
            }
            let t = timed(&|i| self.run(plan, algo, wps[i % wps.len()], xp, yp))?;
            if t < best.0 {
                best = (t, Choice::Lt(*algo));
            }
        }
        let us = 1e3 * best.0 / (PASSES * reps) as f32;
        tracing::debug!(
            "decode: product {} x {} at {} rows: {} ({us:.1} us)",
            plan.out,
            plan.inp,
            plan.rows,
            match best.1 {
                Choice::Cublas => "cuBLAS",
                Choice::Lt(_) => "cuBLASLt",
            }
        );
        Ok(best.1)
    }
}

/// The machine's choices on disk: one line a shape, `KEY<tab>VALUE`, the
/// key `GPU|cuBLASLt VERSION|rows,out,in`, the value `cublas` or `lt` and
/// the algorithm's eight words.
struct ChoiceFile {
    path: Option<PathBuf>,
    prefix: String,
    lines: HashMap<String, String>,
    changed: bool,
}

impl ChoiceFile {
    /// The file for `dev` in the cache folder the environment names.
    fn for_device(dev: &CudaDevice) -> Result<Self> {
        let name = dev.cuda_stream().context().name().w()?;
        // SAFETY: a plain query of the loaded library.
        let version = unsafe { sys::cublasLtGetVersion() };
        let var = |v: &str| {
            std::env::var_os(v)
                .filter(|x| !x.is_empty())
                .map(PathBuf::from)
        };
        let dir = var("TRACE_TRAIN_CACHE_DIR")
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("trace-train")))
            .or_else(|| var("HOME").map(|h| h.join(".cache").join("trace-train")));
        Ok(Self::open(
            dir.map(|d| d.join("decode-products.tsv")),
            format!("{name}|cuBLASLt {version}|"),
        ))
    }

    /// The choices in `path` (none where it is missing or unreadable).
    fn open(path: Option<PathBuf>, prefix: String) -> Self {
        let lines = path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|text| {
                text.lines()
                    .filter_map(|l| l.split_once('\t'))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            path,
            prefix,
            lines,
            changed: false,
        }
    }

    fn key(&self, rows: usize, out: usize, inp: usize) -> String {
        format!("{}{rows},{out},{inp}", self.prefix)
    }

    /// The choice on file for the shape, if it is still one of
    /// `candidates` (or cuBLAS's path).
    fn get(
        &self,
        rows: usize,
        out: usize,
        inp: usize,
        candidates: &[sys::cublasLtMatmulAlgo_t],
    ) -> Option<Choice> {
        let v = self.lines.get(&self.key(rows, out, inp))?;
        if v == "cublas" {
            return Some(Choice::Cublas);
        }
        let words: Vec<u64> = v
            .strip_prefix("lt ")?
            .split(' ')
            .map(|w| w.parse().ok())
            .collect::<Option<_>>()?;
        candidates
            .iter()
            .find(|a| a.data[..] == words[..])
            .map(|a| Choice::Lt(*a))
    }

    fn put(&mut self, rows: usize, out: usize, inp: usize, c: Choice) {
        let v = match c {
            Choice::Cublas => "cublas".to_string(),
            Choice::Lt(a) => format!(
                "lt {}",
                a.data
                    .iter()
                    .map(|w| w.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        };
        self.lines.insert(self.key(rows, out, inp), v);
        self.changed = true;
    }

    /// Writes the file (a temporary file renamed into place) if a choice
    /// was added; a machine where it cannot be written says so and times
    /// again next process.
    fn save(&self) {
        let Some(path) = self.path.as_ref().filter(|_| self.changed) else {
            return;
        };
        let mut keys: Vec<&String> = self.lines.keys().collect();
        keys.sort();
        let text: String = keys
            .iter()
            .map(|k| format!("{k}\t{}\n", self.lines[*k]))
            .collect();
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|_| std::fs::write(&tmp, text))
            .and_then(|_| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(
                "decode: cannot keep the products' algorithms in `{}`: {e}; the next process times them again",
                path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::fast_decode::tests::{gpu, rel, values};

    fn algo(first: u64) -> sys::cublasLtMatmulAlgo_t {
        sys::cublasLtMatmulAlgo_t {
            data: [first, 2, 3, 4, 5, 6, 7, u64::MAX],
        }
    }

    /// Choices written by one process are read back by the next, by GPU,
    /// library version and shape; an algorithm the heuristic no longer
    /// proposes is not taken (the shape is timed again).
    #[test]
    fn chosen_algorithms_survive_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("decode-products.tsv");
        let h100 = || "NVIDIA H100|cuBLASLt 130100|".to_string();
        let mut f = ChoiceFile::open(Some(path.clone()), h100());
        assert_eq!(f.get(32, 6144, 2560, &[algo(1)]), None);
        f.put(32, 6144, 2560, Choice::Lt(algo(9)));
        f.put(32, 2560, 4096, Choice::Cublas);
        f.save();
        let g = ChoiceFile::open(Some(path.clone()), h100());
        let offered = [algo(1), algo(9)];
        assert_eq!(g.get(32, 6144, 2560, &offered), Some(Choice::Lt(algo(9))));
        assert_eq!(g.get(32, 2560, 4096, &offered), Some(Choice::Cublas));
        assert_eq!(g.get(16, 6144, 2560, &offered), None, "another row count");
        assert_eq!(
            g.get(32, 6144, 2560, &[algo(1)]),
            None,
            "no longer proposed"
        );
        let other = ChoiceFile::open(Some(path.clone()), "NVIDIA H200|cuBLASLt 130100|".into());
        assert_eq!(other.get(32, 6144, 2560, &offered), None, "another GPU");
        // A second process adds its shapes to the file, keeping the first's.
        let mut h = ChoiceFile::open(Some(path.clone()), "NVIDIA H200|cuBLASLt 130100|".into());
        h.put(64, 6144, 2560, Choice::Cublas);
        h.save();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(
            !dir.path()
                .join("sub")
                .read_dir()
                .unwrap()
                .any(|e| { e.unwrap().file_name().to_string_lossy().contains("tmp") })
        );
    }

    /// Every algorithm the heuristic proposes at a few decode shapes (rows
    /// 1 to 32, a K of 96 and of 4096) gives f32 matmul's product within
    /// bf16 rounding and the same bits twice; `project` takes the timed
    /// choice, and leaves other row counts to the caller.
    #[test]
    fn every_proposed_algorithm_matches_f32_matmuls() {
        let Some(cuda) = gpu() else { return };
        let dev = Device::Cuda(cuda.clone());
        let bf = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
        for (rows, out, inp) in [(32, 2560, 4096), (5, 1000, 96), (1, 256, 512)] {
            let ws: Vec<Tensor> = (0..3)
                .map(|_| bf(Tensor::randn(0f32, 0.05, (out, inp), &dev).unwrap()))
                .collect();
            let x = bf(Tensor::randn(0f32, 1.0, (rows, inp), &dev).unwrap());
            let refs: Vec<&Tensor> = ws.iter().collect();
            // Timed on three weights that L2 partly holds: kept out of the
            // machine's file.
            let lt =
                LtProducts::with_file(&cuda, rows, &refs, ChoiceFile::open(None, String::new()))
                    .unwrap();
            let plan = &lt.plans[0];
            let candidates = lt.candidates(plan).unwrap();
            assert!(
                !candidates.is_empty(),
                "({rows}, {out}, {inp}): no algorithm"
            );
            let want = x
                .to_dtype(DType::F32)
                .unwrap()
                .matmul(&ws[1].to_dtype(DType::F32).unwrap().t().unwrap())
                .unwrap();
            let mut ran = 0;
            for algo in &candidates {
                let y = uninit(&cuda, DType::BF16, rows, out).unwrap();
                let (wp, xp, yp) = (ptr(&ws[1]).unwrap(), ptr(&x).unwrap(), ptr(&y).unwrap());
                if lt.run(plan, algo, wp, xp, yp).is_err() {
                    continue;
                }
                ran += 1;
                let (e, first) = (rel(&y, &want), values(&y));
                assert!(e < 1e-2, "({rows}, {out}, {inp}) {:?}: {e}", algo.data);
                lt.run(plan, algo, wp, xp, yp).unwrap();
                assert_eq!(
                    first,
                    values(&y),
                    "({rows}, {out}, {inp}) {:?}: the same bits twice",
                    algo.data
                );
            }
            assert!(ran > 0, "({rows}, {out}, {inp}): no algorithm ran");
            match lt.project(&x, &ws[1]).unwrap() {
                Some(y) => {
                    let e = rel(&y, &want);
                    assert!(e < 1e-2, "({rows}, {out}, {inp}) project: {e}");
                    assert!(matches!(plan.choice, Choice::Lt(_)));
                }
                None => assert_eq!(plan.choice, Choice::Cublas),
            }
            let other = bf(Tensor::randn(0f32, 1.0, (rows + 1, inp), &dev).unwrap());
            assert!(
                lt.project(&other, &ws[1]).unwrap().is_none(),
                "another row count"
            );
        }
    }
}
