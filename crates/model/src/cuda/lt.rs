//! What the cuBLASLt users (the decode step's products, FP8 products)
//! share: an error mapping and the heuristic's proposals for a product.

use candle_core::Result;
use candle_core::cuda_backend::cudarc::cublaslt::{result, sys};

/// `r`'s cuBLASLt error as candle's, naming `what` failed.
pub fn lt<T>(what: &str, r: std::result::Result<T, result::CublasError>) -> Result<T> {
    r.map_err(|e| candle_core::Error::Msg(format!("cuBLASLt {what}: {e:?}")))
}

/// The product `desc` over the layouts `a`, `b`, `c` and `d`: up to `count`
/// algorithms cuBLASLt's heuristic proposes for `workspace` bytes, best
/// first; `Err` with what cuBLASLt answered where it proposes none.
///
/// # Safety
/// `handle`, `desc` and the layouts must be live cuBLASLt objects.
pub unsafe fn proposals(
    handle: sys::cublasLtHandle_t,
    desc: sys::cublasLtMatmulDesc_t,
    [a, b, c, d]: [sys::cublasLtMatrixLayout_t; 4],
    workspace: usize,
    count: usize,
) -> Result<std::result::Result<Vec<sys::cublasLtMatmulAlgo_t>, String>> {
    let pref = lt("preference", result::create_matmul_pref())?;
    let ws = workspace as u64;
    let mut got = vec![
        // SAFETY: a plain C struct the call below fills.
        unsafe { std::mem::zeroed::<sys::cublasLtMatmulHeuristicResult_t>() };
        count
    ];
    let mut n = 0;
    // SAFETY: pref was just made; the caller vouches for the rest; `got`
    // holds `count` results.
    let status = unsafe {
        result::set_matmul_pref_attribute(
            pref,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&ws) as *const u64 as *const _,
            std::mem::size_of::<u64>(),
        )
        .and_then(|_| {
            sys::cublasLtMatmulAlgoGetHeuristic(
                handle,
                desc,
                a,
                b,
                c,
                d,
                pref,
                count as i32,
                got.as_mut_ptr(),
                &mut n,
            )
            .result()
        })
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { result::destroy_matmul_pref(pref) };
    if let Err(e) = status {
        return Ok(Err(format!("{e:?}")));
    }
    let algos: Vec<_> = got[..n.max(0) as usize]
        .iter()
        .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
        .map(|r| r.algo)
        .collect();
    Ok(if algos.is_empty() {
        Err(format!("{n} proposals, none usable"))
    } else {
        Ok(algos)
    })
}
