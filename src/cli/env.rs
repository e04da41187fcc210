//! `env`: what a user pastes into a bug report. The build (version, git
//! commit, features), the machine (OS, kernel, cores, memory), the GPU
//! stack as this process finds it (driver, CUDA driver API, devices, cuDNN,
//! cuBLAS), the sandbox's interpreter and the protections in force (the
//! same probe as `sandbox check`), and the Hugging Face settings (never the
//! token). Nothing here fails for lack of a GPU or of root: what is not
//! found is reported as such.
//!
//! The GPU libraries are opened with `dlopen`, as CUDA programs find them
//! at run time, so a CPU build reports them too; their version calls take
//! no handle and touch no device memory.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use trace_train::model::io::resolve::HubSettings;
use trace_train::sandbox::{self, Executor, ExecutorConfig, ProtectionReport};

#[derive(Args)]
#[command(rename_all = "snake_case")]
pub struct EnvArgs {
    /// Print JSON (for machines) instead of text.
    #[arg(long)]
    pub json: bool,
    /// The interpreter the sandbox runs (default: `python` in
    /// config/generate.json, else /usr/bin/python3).
    #[arg(long)]
    pub python: Option<PathBuf>,
}

#[derive(Serialize)]
pub struct Report {
    pub trace_train: Build,
    pub system: System,
    pub gpu: Gpu,
    pub sandbox: SandboxInfo,
    pub hugging_face: HubSettings,
}

#[derive(Serialize)]
pub struct Build {
    pub version: &'static str,
    /// The commit the binary was built from, when the build saw a git
    /// checkout.
    pub git_commit: Option<&'static str>,
    pub features: Vec<&'static str>,
    pub profile: &'static str,
}

#[derive(Serialize)]
pub struct System {
    pub os: Option<String>,
    pub kernel: Option<String>,
    pub arch: &'static str,
    pub cpu_cores: usize,
    pub memory_bytes: Option<u64>,
}

#[derive(Serialize)]
pub struct Gpu {
    /// The NVIDIA kernel driver's version (/proc/driver/nvidia/version).
    pub driver: Option<String>,
    /// The CUDA version the driver supports (cuDriverGetVersion), e.g. 13.0.
    pub cuda_driver_api: Option<String>,
    pub devices: Vec<Device>,
    /// libcudnn's version (cudnnGetVersion), e.g. 9.10.2.
    pub cudnn: Option<String>,
    /// libcublas's version.
    pub cublas: Option<String>,
    /// Why no device was found, when none was.
    pub note: Option<String>,
}

#[derive(Serialize)]
pub struct Device {
    pub index: usize,
    pub name: String,
    pub memory_bytes: u64,
}

#[derive(Serialize)]
pub struct SandboxInfo {
    pub python: PathBuf,
    /// `python --version`, or why it could not run.
    pub python_version: String,
    /// The protections found in force, when the sandbox started.
    pub protections: Option<ProtectionReport>,
    /// Why the sandbox did not start (no root and no user namespaces).
    pub error: Option<String>,
}

pub fn run(args: &EnvArgs) -> anyhow::Result<()> {
    let report = gather(args);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text(&report));
    }
    Ok(())
}

pub fn gather(args: &EnvArgs) -> Report {
    let python = args.python.clone().unwrap_or_else(default_python);
    Report {
        trace_train: Build {
            version: env!("CARGO_PKG_VERSION"),
            git_commit: option_env!("TRACE_TRAIN_GIT_COMMIT"),
            features: [
                cfg!(feature = "cuda").then_some("cuda"),
                cfg!(feature = "cudnn").then_some("cudnn"),
            ]
            .into_iter()
            .flatten()
            .collect(),
            profile: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
        },
        system: System {
            os: os_release(),
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            arch: std::env::consts::ARCH,
            cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_bytes: mem_total(),
        },
        gpu: gpu(),
        sandbox: sandbox_info(python),
        hugging_face: HubSettings::from_env(),
    }
}

/// The report as text, one `name: value` line each.
pub fn text(r: &Report) -> String {
    let or_none = |v: &Option<String>| v.clone().unwrap_or_else(|| "none found".into());
    let mut out = String::new();
    let b = &r.trace_train;
    out += &format!(
        "trace-train {} ({} build, commit {}, features: {})\n",
        b.version,
        b.profile,
        b.git_commit.unwrap_or("unknown"),
        if b.features.is_empty() {
            "none (CPU only)".into()
        } else {
            b.features.join(", ")
        }
    );
    let s = &r.system;
    out += &format!(
        "os: {}; kernel {}; {}\n",
        s.os.as_deref().unwrap_or("unknown"),
        s.kernel.as_deref().unwrap_or("unknown"),
        s.arch
    );
    out += &format!(
        "cpu: {} cores; memory: {}\n",
        s.cpu_cores,
        s.memory_bytes
            .map_or("unknown".into(), |m| format!("{:.1} GiB", gib(m)))
    );
    let g = &r.gpu;
    if g.devices.is_empty() {
        out += &format!(
            "gpu: none found{}\n",
            g.note
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        );
    }
    for d in &g.devices {
        out += &format!(
            "gpu {}: {} ({:.1} GiB)\n",
            d.index,
            d.name,
            gib(d.memory_bytes)
        );
    }
    out += &format!(
        "nvidia driver: {}; cuda (driver api): {}; cudnn: {}; cublas: {}\n",
        or_none(&g.driver),
        or_none(&g.cuda_driver_api),
        or_none(&g.cudnn),
        or_none(&g.cublas)
    );
    let sb = &r.sandbox;
    out += &format!(
        "sandbox python: {} ({})\n",
        sb.python.display(),
        sb.python_version
    );
    match (&sb.protections, &sb.error) {
        (Some(p), _) => {
            out += &format!(
                "sandbox: {} of {} protections in force; mode {}\n",
                p.protections.iter().filter(|p| p.in_force).count(),
                p.protections.len(),
                super::sandbox::mode_line(p.mode)
            );
            let rootless = p.mode == "rootless";
            for p in &p.protections {
                let held = match (p.in_force, p.needs_root && rootless) {
                    (true, _) => "yes",
                    (false, true) => "no (needs root)",
                    (false, false) => "NO",
                };
                out += &format!("  {:<22} {:<15} {}\n", p.name, held, p.evidence);
            }
        }
        (None, e) => {
            out += &format!(
                "sandbox: not started: {}\n",
                e.as_deref().unwrap_or("unknown")
            )
        }
    }
    let h = &r.hugging_face;
    out += &format!(
        "hf: home {}; cache {}; offline {}; token {}\n",
        h.home.display(),
        h.cache.display(),
        if h.offline { "yes" } else { "no" },
        h.token_from
            .as_deref()
            .map_or("not set".into(), |from| format!("set (from {from})"))
    );
    out
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn default_python() -> PathBuf {
    let file = Path::new("config/generate.json");
    if file.is_file()
        && let Ok(g) = trace_train::config::load::<trace_train::config::GenerateConfig>(file)
    {
        return g.python;
    }
    PathBuf::from("/usr/bin/python3")
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

fn os_release() -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_owned())
}

fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn sandbox_info(python: PathBuf) -> SandboxInfo {
    let python_version = match std::process::Command::new(&python)
        .arg("--version")
        .output()
    {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        Ok(o) => format!(
            "`--version` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run: {e}"),
    };
    match Executor::new(ExecutorConfig::new(&python, 1, false)) {
        Ok(exec) => SandboxInfo {
            protections: Some(sandbox::check_protections(&exec)),
            python,
            python_version,
            error: None,
        },
        Err(e) => SandboxInfo {
            python,
            python_version,
            protections: None,
            error: Some(format!("{e:#}")),
        },
    }
}

/// A shared library opened with `dlopen`, closed on drop.
struct Lib(*mut c_void);

impl Lib {
    /// The first of `names` that opens.
    fn open(names: &[&CStr]) -> Option<Lib> {
        names.iter().find_map(|n| {
            // SAFETY: a NUL-terminated name; the handle is checked.
            let h = unsafe { libc::dlopen(n.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            // `then`, not `then_some`: a `Lib` made of a null handle would
            // be dropped, and closed, right away.
            (!h.is_null()).then(|| Lib(h))
        })
    }

    /// The symbol `name`, as a function pointer of type `F`.
    ///
    /// SAFETY: `F` must be the symbol's true C signature.
    unsafe fn sym<F: Copy>(&self, name: &CStr) -> Option<F> {
        // SAFETY: a valid handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        if p.is_null() {
            None
        } else {
            // SAFETY: the caller promises `F` is the symbol's signature,
            // and function pointers have the size of data pointers here.
            Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
        }
    }
}

impl Drop for Lib {
    fn drop(&mut self) {
        // SAFETY: a handle from dlopen, closed once.
        unsafe { libc::dlclose(self.0) };
    }
}

fn gpu() -> Gpu {
    let mut g = Gpu {
        driver: read_trimmed("/proc/driver/nvidia/version").and_then(|v| {
            let line = v.lines().next()?.to_owned();
            let after = line.split("Kernel Module").nth(1)?;
            after.split_whitespace().next().map(str::to_owned)
        }),
        cuda_driver_api: None,
        devices: Vec::new(),
        cudnn: None,
        cublas: None,
        note: None,
    };
    match Lib::open(&[c"libcuda.so.1", c"libcuda.so"]) {
        None => g.note = Some("no CUDA driver library (libcuda.so.1)".into()),
        Some(cuda) => cuda_devices(&cuda, &mut g),
    }
    if let Some(lib) = Lib::open(&[c"libcudnn.so.9", c"libcudnn.so"]) {
        // SAFETY: `size_t cudnnGetVersion(void)`.
        if let Some(f) = unsafe { lib.sym::<unsafe extern "C" fn() -> usize>(c"cudnnGetVersion") } {
            // SAFETY: takes nothing, returns a number.
            let v = unsafe { f() };
            g.cudnn = Some(cudnn_version(v));
        }
    }
    if let Some(lib) = Lib::open(&[c"libcublas.so.13", c"libcublas.so.12", c"libcublas.so"]) {
        type GetProperty = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;
        // SAFETY: `cublasStatus_t cublasGetProperty(libraryPropertyType, int*)`.
        if let Some(f) = unsafe { lib.sym::<GetProperty>(c"cublasGetProperty") } {
            let mut v = [0 as c_int; 3];
            // SAFETY: MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2, each
            // written into a live int.
            let ok = (0..3).all(|i| unsafe { f(i as c_int, &mut v[i]) } == 0);
            if ok {
                g.cublas = Some(format!("{}.{}.{}", v[0], v[1], v[2]));
            }
        }
    }
    g
}

/// cudnnGetVersion's number as text: cuDNN 9 encodes major*10000 +
/// minor*100 + patch, cuDNN 8 and older major*1000 + minor*100 + patch.
fn cudnn_version(v: usize) -> String {
    if v >= 90000 {
        format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, v / 100 % 10, v % 100)
    }
}

/// The CUDA driver API's version and devices.
fn cuda_devices(cuda: &Lib, g: &mut Gpu) {
    type Init = unsafe extern "C" fn(c_uint) -> c_int;
    type IntOut = unsafe extern "C" fn(*mut c_int) -> c_int;
    type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
    type DeviceName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
    type TotalMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
    // SAFETY: the CUDA driver API's signatures (CUresult is an int, CUdevice
    // an int).
    let syms = unsafe {
        (
            cuda.sym::<Init>(c"cuInit"),
            cuda.sym::<IntOut>(c"cuDriverGetVersion"),
            cuda.sym::<IntOut>(c"cuDeviceGetCount"),
            cuda.sym::<DeviceGet>(c"cuDeviceGet"),
            cuda.sym::<DeviceName>(c"cuDeviceGetName"),
            cuda.sym::<TotalMem>(c"cuDeviceTotalMem_v2"),
        )
    };
    let (Some(init), Some(version), Some(count), Some(get), Some(name), Some(mem)) = syms else {
        g.note = Some("the CUDA driver library lacks the driver API".into());
        return;
    };
    // SAFETY: each call writes into a live local of the declared type.
    unsafe {
        let mut v = 0;
        if version(&mut v) == 0 {
            g.cuda_driver_api = Some(format!("{}.{}", v / 1000, v % 1000 / 10));
        }
        let rc = init(0);
        if rc != 0 {
            g.note = Some(format!("cuInit failed with CUDA error {rc}"));
            return;
        }
        let mut n = 0;
        if count(&mut n) != 0 || n == 0 {
            g.note = Some("the CUDA driver sees no device".into());
            return;
        }
        for i in 0..n {
            let mut dev = 0;
            if get(&mut dev, i) != 0 {
                continue;
            }
            let mut buf = [0 as c_char; 256];
            let name = if name(buf.as_mut_ptr(), buf.len() as c_int, dev) == 0 {
                CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
            } else {
                "unknown".into()
            };
            let mut bytes = 0usize;
            mem(&mut bytes, dev);
            g.devices.push(Device {
                index: i as usize,
                name,
                memory_bytes: bytes as u64,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cudnn_versions_decode() {
        assert_eq!(super::cudnn_version(91002), "9.10.2");
        assert_eq!(super::cudnn_version(8907), "8.9.7");
    }
}
