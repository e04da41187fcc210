//! What a CUDA device needs beyond candle: a memory pool that keeps what it
//! frees, the pool's high-water mark for benchmarks, and the memory still
//! free (Stage 3's micro-batch budget).
//!
//! cudarc allocates with `cuMemAllocAsync` from the device's default pool,
//! whose release threshold is 0: every synchronisation hands freed memory
//! back to the driver, and the next step asks for it again. Raising the
//! threshold keeps it in the pool (what PyTorch's caching allocator does).
//! The pool's `USED_MEM_HIGH` attribute is the peak of memory in use, read
//! from the device rather than from nvidia-smi. On a CPU build or device
//! these are no-ops.

use candle_core::Device;

/// Keep freed device memory in the pool instead of returning it to the
/// driver at each synchronisation.
pub fn keep_freed_memory(device: &Device) -> anyhow::Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        pool::set(d, pool::Attr::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, u64::MAX)?;
    }
    let _ = device;
    Ok(())
}

/// Peak bytes in use in the device's pool since the last
/// [`reset_peak_memory`]; `None` off CUDA.
pub fn peak_memory(device: &Device) -> anyhow::Result<Option<u64>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        device.synchronize()?;
        let high = pool::get(d, pool::Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?;
        let marked = MARKED_PEAK.load(std::sync::atomic::Ordering::Relaxed);
        return Ok(Some(high.max(marked)));
    }
    let _ = device;
    Ok(None)
}

/// Whether `TRACE_TRAIN_MEMORY` is set: [`memory_mark`] then prints the
/// peak of each phase of a training step.
fn memory_trace_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("TRACE_TRAIN_MEMORY").is_some_and(|v| v != "0"))
}

/// The highest peak [`memory_mark`] has read since the last
/// [`reset_peak_memory`]: each mark restarts the pool's own high-water
/// mark, so [`peak_memory`] takes the larger of the two.
#[cfg(feature = "cuda")]
static MARKED_PEAK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// With `TRACE_TRAIN_MEMORY=1`, prints to stderr the peak of the device
/// pool's memory in use since the previous mark (the phase that ends here,
/// named by `label`) and what is in use now, then starts the next phase's
/// peak; without it, does nothing. A diagnostic: it synchronises the device
/// at every mark. Where a training step's memory peaks, phase by phase
/// (forward, loss, each layer's recompute and backward, optimizer).
pub fn memory_mark(device: &Device, label: &str) -> anyhow::Result<()> {
    if !memory_trace_on() {
        return Ok(());
    }
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        use std::sync::atomic::Ordering;
        device.synchronize()?;
        let high = pool::get(d, pool::Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?;
        let now = pool::get(d, pool::Attr::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
        MARKED_PEAK.fetch_max(high, Ordering::Relaxed);
        pool::set(d, pool::Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)?;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        eprintln!(
            "memory {label}: peak {:.3} GiB, in use {:.3} GiB",
            gib(high),
            gib(now)
        );
    }
    let _ = (device, label);
    Ok(())
}

/// [`peak_memory`] in GiB, to the hundredth: what benchmarks print and
/// the training stages log (`peak_mem_gib`).
pub fn peak_memory_gib(device: &Device) -> anyhow::Result<Option<f64>> {
    Ok(peak_memory(device)?.map(|b| (b as f64 / (1u64 << 30) as f64 * 100.0).round() / 100.0))
}

/// Starts a new peak measurement at the memory in use now.
pub fn reset_peak_memory(device: &Device) -> anyhow::Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        device.synchronize()?;
        pool::set(d, pool::Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)?;
        MARKED_PEAK.store(0, std::sync::atomic::Ordering::Relaxed);
    }
    let _ = device;
    Ok(())
}

/// Bytes this process can still allocate on the device: the driver's free
/// memory plus what the pool holds reserved but unused (kept by
/// [`keep_freed_memory`]); `None` off CUDA.
pub fn free_memory(device: &Device) -> anyhow::Result<Option<u64>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        device.synchronize()?;
        let (free, _total) = d.cuda_stream().context().mem_get_info()?;
        let reserved = pool::get(d, pool::Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
        let used = pool::get(d, pool::Attr::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
        return Ok(Some(free as u64 + reserved.saturating_sub(used)));
    }
    let _ = device;
    Ok(None)
}

/// Bytes of the device's pool in use now (no synchronisation: a reading
/// from another thread while the GPU works); `None` off CUDA.
pub fn used_memory(device: &Device) -> anyhow::Result<Option<u64>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        return Ok(Some(pool::get(
            d,
            pool::Attr::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        )?));
    }
    let _ = device;
    Ok(None)
}

/// The profiler's range (`ncu --profile-from-start off`) while the value
/// lives, on a CUDA device; `None` elsewhere. Drop it to close the range.
pub fn profiler_range(device: &Device) -> anyhow::Result<Option<Box<dyn std::any::Any>>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(_) = device {
        device.synchronize()?;
        let p = candle_core::cuda::cudarc::driver::Profiler::new()?;
        return Ok(Some(Box::new(p)));
    }
    let _ = device;
    Ok(None)
}

#[cfg(feature = "cuda")]
mod pool {
    use anyhow::Context;
    use candle_core::CudaDevice;
    use candle_core::cuda::cudarc::driver::sys;

    pub use sys::CUmemPool_attribute as Attr;

    fn default_pool(d: &CudaDevice) -> anyhow::Result<sys::CUmemoryPool> {
        let stream = d.cuda_stream();
        let ctx = stream.context();
        ctx.bind_to_thread()?;
        let mut pool = std::ptr::null_mut();
        // SAFETY: a valid device of a context bound to this thread; the
        // out-pointer is a local.
        let r = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
        check(r).context("cannot get the device's memory pool")?;
        Ok(pool)
    }

    fn check(r: sys::CUresult) -> anyhow::Result<()> {
        anyhow::ensure!(r == sys::CUresult::CUDA_SUCCESS, "CUDA driver error {r:?}");
        Ok(())
    }

    pub fn set(d: &CudaDevice, attr: Attr, value: u64) -> anyhow::Result<()> {
        let pool = default_pool(d)?;
        let mut v = value;
        // SAFETY: both attributes used here take a cuuint64_t.
        let r = unsafe { sys::cuMemPoolSetAttribute(pool, attr, (&mut v as *mut u64).cast()) };
        check(r).with_context(|| format!("cannot set the memory pool's {attr:?}"))
    }

    pub fn get(d: &CudaDevice, attr: Attr) -> anyhow::Result<u64> {
        let pool = default_pool(d)?;
        let mut v = 0u64;
        // SAFETY: as in `set`.
        let r = unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut v as *mut u64).cast()) };
        check(r).with_context(|| format!("cannot read the memory pool's {attr:?}"))?;
        Ok(v)
    }
}
