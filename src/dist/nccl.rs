//! [`Nccl`]: the communicator of a multi-GPU run, one process a GPU, through
//! NCCL's collectives (cudarc's bindings; libnccl is loaded at run time).
//!
//! The communicator is bound to candle's stream of this rank's device, so a
//! collective is ordered after the kernels that produced its input and
//! before those that read its output, with no extra synchronisation. Only
//! the scalar gather copies back to the host (it has to: its values steer
//! the loop).

use anyhow::{Context, anyhow, bail};
use candle_core::cuda_backend::CudaStorage;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, DType, Device, Storage, Tensor};
use cudarc::nccl::result::NcclError;
use cudarc::nccl::safe::{Comm, Id, ReduceOp};

use super::Communicator;

/// NCCL's unique id: 128 bytes, made by one process and handed to all
/// ranks (as hex) before they build their communicators.
pub fn unique_id_hex() -> anyhow::Result<String> {
    let id = Id::new().map_err(|e| nccl_error(e, "ncclGetUniqueId"))?;
    let bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
    Ok(crate::hex(&bytes))
}

fn parse_id(hex: &str) -> anyhow::Result<Id> {
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("x"), 16))
        .collect::<Result<_, _>>()
        .ok()
        .filter(|b: &Vec<u8>| b.len() == 128)
        .with_context(|| format!("the NCCL id `{hex:.16}...` is not 256 hex digits"))?;
    let mut internal = [0 as std::ffi::c_char; 128];
    for (d, s) in internal.iter_mut().zip(&bytes) {
        *d = *s as std::ffi::c_char;
    }
    Ok(Id::uninit(internal))
}

fn nccl_error(e: NcclError, what: &str) -> anyhow::Error {
    anyhow!("NCCL {what} failed: {:?}", e.0)
}

/// One rank's NCCL communicator.
pub struct Nccl {
    comm: Comm,
    device: CudaDevice,
}

impl Nccl {
    /// Joins the group of `world` ranks named by `id_hex` as `rank`, on
    /// `device` (a CUDA device). Blocks until every rank has joined.
    pub fn new(device: &Device, rank: usize, world: usize, id_hex: &str) -> anyhow::Result<Self> {
        let Device::Cuda(dev) = device else {
            bail!(
                "NCCL needs a CUDA device, not {device:?}\nhint: several ranks run on GPUs only; use --num_gpus 1 on the CPU"
            );
        };
        let id = parse_id(id_hex)?;
        // NCCL joins with the calling thread's current device: make it this
        // rank's.
        dev.cuda_stream().context().bind_to_thread()?;
        let comm = Comm::from_rank(dev.cuda_stream(), rank, world, id)
            .map_err(|e| nccl_error(e, &format!("init of rank {rank} of {world}")))?;
        Ok(Nccl {
            comm,
            device: dev.clone(),
        })
    }

    /// [`Nccl::new`] with the id rank 0 makes, handed to the others where
    /// `meeting` says (a folder on one host, TCP across hosts); a rank waits
    /// up to `wait` for it.
    pub fn join(
        device: &Device,
        rank: usize,
        world: usize,
        meeting: &crate::dist::meet::Meeting,
        wait: std::time::Duration,
    ) -> anyhow::Result<Self> {
        let id = crate::dist::meet::share_id(meeting, rank, world, unique_id_hex, wait)?;
        Self::new(device, rank, world, id.trim())
    }

    fn wrap(&self, slice: cudarc::driver::CudaSlice<f32>, n: usize) -> Tensor {
        let storage = CudaStorage::wrap_cuda_slice(slice, self.device.clone());
        Tensor::from_storage(Storage::Cuda(storage), n, BackpropOp::none(), false)
    }

    /// `f(input, output)` on a fresh output buffer of the input's length.
    fn collective(
        &self,
        flat: &Tensor,
        what: &str,
        f: impl FnOnce(
            &cudarc::driver::CudaView<'_, f32>,
            &mut cudarc::driver::CudaSlice<f32>,
        ) -> Result<cudarc::nccl::result::NcclStatus, NcclError>,
    ) -> anyhow::Result<Tensor> {
        let flat = flat.to_dtype(DType::F32)?.contiguous()?;
        let n = flat.elem_count();
        if n == 0 {
            return Ok(flat);
        }
        let stream = self.device.cuda_stream();
        let mut out = stream.alloc_zeros::<f32>(n)?;
        {
            let (st, l) = flat.storage_and_layout();
            let Storage::Cuda(s) = &*st else {
                bail!("NCCL {what}: the tensor is not on a CUDA device");
            };
            let start = l.start_offset();
            let src = s.as_cuda_slice::<f32>()?.slice(start..start + n);
            f(&src, &mut out).map_err(|e| nccl_error(e, what))?;
        }
        Ok(self.wrap(out, n))
    }
}

impl Communicator for Nccl {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world(&self) -> usize {
        self.comm.world_size()
    }

    fn all_reduce_f32(&self, flat: &Tensor) -> anyhow::Result<Tensor> {
        self.collective(flat, "all-reduce", |src, out| {
            self.comm.all_reduce(src, out, &ReduceOp::Sum)
        })
    }

    fn broadcast_f32(&self, flat: &Tensor, root: usize) -> anyhow::Result<Tensor> {
        let mine = self.rank() == root;
        self.collective(flat, "broadcast", |src, out| {
            self.comm.broadcast(mine.then_some(src), out, root as i32)
        })
    }

    fn all_gather_f64(&self, values: &[f64]) -> anyhow::Result<Vec<Vec<f64>>> {
        let (n, world) = (values.len(), self.world());
        if n == 0 {
            return Ok(vec![Vec::new(); world]);
        }
        let stream = self.device.cuda_stream();
        let send = stream.clone_htod(values)?;
        let mut recv = stream.alloc_zeros::<f64>(n * world)?;
        self.comm
            .all_gather(&send, &mut recv)
            .map_err(|e| nccl_error(e, "all-gather"))?;
        let host = stream.clone_dtoh(&recv)?;
        Ok(host.chunks(n).map(<[f64]>::to_vec).collect())
    }

    /// Rank 0 makes an NCCL id for each group of several ranks and hands
    /// them to all through this communicator; each rank then joins its
    /// group's (a group of one is [`super::Single`]).
    fn split(&self, groups: &[Vec<usize>]) -> anyhow::Result<Box<dyn Communicator>> {
        let (group, place) = super::place_in(groups, self.rank(), self.world())?;
        let ids = if self.rank() == 0 {
            groups
                .iter()
                .map(|m| {
                    if m.len() > 1 {
                        unique_id_hex()
                    } else {
                        Ok(String::new())
                    }
                })
                .collect::<anyhow::Result<Vec<_>>>()?
                .join(",")
        } else {
            String::new()
        };
        let all = super::stats::all_gather_bytes(self, ids.as_bytes())?;
        let ids = String::from_utf8(all[0].clone()).context("the split's NCCL ids")?;
        let id = ids
            .split(',')
            .nth(group)
            .context("no NCCL id for this rank's group")?;
        let members = groups[group].len();
        if members == 1 {
            return Ok(Box::new(super::Single));
        }
        Ok(Box::new(Nccl::new(
            &Device::Cuda(self.device.clone()),
            place,
            members,
            id,
        )?))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_round_trip_through_hex() {
        let hex: String = (0..128u32)
            .map(|i| format!("{:02x}", (i * 7) % 256))
            .collect();
        let id = super::parse_id(&hex).unwrap();
        let back: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
        assert_eq!(crate::hex(&back), hex);
        assert!(super::parse_id("abc").is_err());
        assert!(super::parse_id(&"zz".repeat(128)).is_err());
    }
}
