//! The checks `mesos-gpu gpu probe` makes on one GPU (the default probe command), each step
//! timed and reported. It reads and allocates only: it never changes a GPU setting (no reset,
//! no compute or MIG mode change, no clocks), so it is safe to run by hand on a production node.
//!
//! Steps:
//! 1. NVML: the GPU by UUID (its name and index), its PCI bus id and memory, the driver's
//!    recovery action (field 230; `NOT_SUPPORTED` is skipped), the row remapper (a pending or
//!    failed remapping fails), the volatile uncorrected ECC count (reported).
//! 2. CUDA, when a CUDA driver library loads (`libcuda.so.1` by default): `cuInit`, the device
//!    whose `cuDeviceGetUuid` is the GPU's, `cuCtxCreate`, `cuMemAlloc` of a buffer, a pattern
//!    written (`cuMemcpyHtoD`), read back (`cuMemcpyDtoH`) and compared, `cuMemFree`,
//!    `cuCtxDestroy`. Skipped for a GPU in MIG mode (CUDA sees its MIG devices, not the GPU).

use std::ffi::OsStr;
use std::fmt;
use std::time::{Duration, Instant};

use super::evidence;
use super::recovery::{Reading, recovery_action_words};
use mesos_gpu_node::cuda::Cuda;
use mesos_gpu_node::discovery::GpuDriver;
use mesos_gpu_node::inventory::Gpu;

/// The CUDA driver library looked for by default.
pub const DEFAULT_CUDA_LIB: &str = "libcuda.so.1";
/// The buffer the CUDA steps write and read back.
pub const DEFAULT_CHECK_BYTES: usize = 64 << 20;

/// One step's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepResult {
    /// It worked; what was seen.
    Passed(String),
    /// It failed; why.
    Failed(String),
    /// Not run; why.
    Skipped(String),
}

/// One step of the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What the step does.
    pub name: &'static str,
    /// How it went.
    pub result: StepResult,
    /// How long it took.
    pub elapsed: Duration,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (mark, text) = match &self.result {
            StepResult::Passed(t) => ("ok  ", t),
            StepResult::Failed(t) => ("FAIL", t),
            StepResult::Skipped(t) => ("skip", t),
        };
        write!(
            f,
            "{mark} {:<44} {text} ({:.1} ms)",
            self.name,
            self.elapsed.as_secs_f64() * 1000.0
        )
    }
}

/// What the check uses.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The CUDA driver library (a path, or a name the loader searches for).
    pub cuda_lib: std::ffi::OsString,
    /// Bytes the CUDA steps allocate, write and read back.
    pub bytes: usize,
}

impl Default for CheckOptions {
    fn default() -> CheckOptions {
        CheckOptions {
            cuda_lib: DEFAULT_CUDA_LIB.into(),
            bytes: DEFAULT_CHECK_BYTES,
        }
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` of the 16 bytes CUDA reports.
pub fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

struct Steps<'r> {
    report: &'r mut dyn FnMut(&Step),
    failed: bool,
}

impl Steps<'_> {
    /// Runs `body` as step `name`, reports it, and returns its value when it passed.
    fn run<T>(
        &mut self,
        name: &'static str,
        body: impl FnOnce() -> Result<(T, String), String>,
    ) -> Option<T> {
        let started = Instant::now();
        let (value, result) = match body() {
            Ok((v, text)) => (Some(v), StepResult::Passed(text)),
            Err(text) => (None, StepResult::Failed(text)),
        };
        self.failed |= value.is_none();
        (self.report)(&Step {
            name,
            result,
            elapsed: started.elapsed(),
        });
        value
    }

    fn skip(&mut self, name: &'static str, why: String) {
        (self.report)(&Step {
            name,
            result: StepResult::Skipped(why),
            elapsed: Duration::ZERO,
        });
    }
}

/// Checks `gpu` through `driver`'s NVML and, when it loads, the CUDA driver library; reports
/// each step to `report`. True when no step failed.
pub fn check_gpu(
    driver: &GpuDriver,
    gpu: &Gpu,
    options: &CheckOptions,
    report: &mut dyn FnMut(&Step),
) -> bool {
    let mut steps = Steps {
        report,
        failed: false,
    };
    let nvml = driver.nvml();
    let Some(device) = steps.run("NVML: find the GPU by UUID", || {
        let d = nvml
            .device_by_uuid(gpu.uuid.as_str())
            .map_err(|e| e.to_string())?;
        let name = d.name().map_err(|e| e.to_string())?;
        let index = d.index().map_err(|e| e.to_string())?;
        Ok((d, format!("{name}, index {index}")))
    }) else {
        return false;
    };
    steps.run("NVML: PCI bus id and memory", || {
        let pci = device.pci_info().map_err(|e| e.to_string())?;
        let mem = device.memory_info().map_err(|e| e.to_string())?;
        Ok((
            (),
            format!(
                "{}, {} MiB total, {} MiB used",
                pci.bus_id,
                mem.total >> 20,
                mem.used >> 20
            ),
        ))
    });
    match evidence::recovery_action(&device) {
        Reading::Unsupported => steps.skip(
            "NVML: recovery action (field 230)",
            "not reported by this driver".to_owned(),
        ),
        other => {
            steps.run("NVML: recovery action (field 230)", || match other {
                Reading::Value(0) => Ok(((), "NONE".to_owned())),
                Reading::Value(a) => Err(format!(
                    "the driver asks for {} ({a})",
                    recovery_action_words(a)
                )),
                Reading::Failed(e) => Err(e),
                Reading::Unsupported => Err("not supported".to_owned()),
            });
        }
    }
    match mesos_gpu_node::discovery::remapped_rows(nvml, &device) {
        Err(nvml_wrapper::error::NvmlError::NotSupported) => steps.skip(
            "NVML: row remapper",
            "not supported (no row remapping on this GPU, or MIG on)".to_owned(),
        ),
        rows => {
            steps.run("NVML: row remapper", || {
                let r = rows.map_err(|e| e.to_string())?;
                let text = format!(
                    "{} correctable, {} uncorrectable, pending {}, failure {}",
                    r.correctable, r.uncorrectable, r.pending, r.failure
                );
                if r.pending || r.failure {
                    Err(text)
                } else {
                    Ok(((), text))
                }
            });
        }
    }
    steps.run("NVML: volatile uncorrected ECC errors", || {
        use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
        match device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
            Ok(n) => Ok(((), n.to_string())),
            Err(nvml_wrapper::error::NvmlError::NotSupported) => {
                Ok(((), "ECC off or not supported".to_owned()))
            }
            Err(e) => Err(e.to_string()),
        }
    });
    if driver.inventory().mig.enabled.contains(&gpu.index) {
        steps.skip(
            "CUDA",
            "the GPU is in MIG mode: CUDA sees its MIG devices, not the GPU".to_owned(),
        );
        return !steps.failed;
    }
    cuda_steps(&mut steps, gpu, options);
    !steps.failed
}

fn cuda_steps(steps: &mut Steps<'_>, gpu: &Gpu, options: &CheckOptions) {
    let lib = options.cuda_lib.to_string_lossy().into_owned();
    let cuda = match Cuda::load(OsStr::new(&options.cuda_lib)) {
        Ok(cuda) => cuda,
        Err(e) => {
            steps.skip(
                "CUDA: load the driver library",
                format!("{lib} does not load ({e}): CUDA checks skipped"),
            );
            return;
        }
    };
    let cu = |e: mesos_gpu_node::cuda::CudaError| e.to_string();
    if steps
        .run("CUDA: load the driver library and cuInit", || {
            cuda.init().map_err(cu)?;
            let v = cuda.driver_version().map_err(cu)?;
            Ok(((), format!("{lib}, CUDA {}.{}", v / 1000, v % 1000 / 10)))
        })
        .is_none()
    {
        return;
    }
    let Some(dev) = steps.run("CUDA: the device with the GPU's UUID", || {
        let count = cuda.device_count().map_err(cu)?;
        let mut seen = Vec::new();
        for ordinal in 0..count {
            let dev = cuda.device(ordinal).map_err(cu)?;
            let uuid = uuid_text(&cuda.uuid(dev).map_err(cu)?);
            if uuid.eq_ignore_ascii_case(&gpu.uuid) {
                let pci = cuda.pci_bus_id(dev).unwrap_or_else(|e| e.to_string());
                return Ok((dev, format!("ordinal {ordinal} of {count}, PCI {pci}")));
            }
            seen.push(uuid);
        }
        Err(format!(
            "none of the {count} CUDA devices is {} (seen: {})",
            gpu.uuid,
            if seen.is_empty() {
                "none".to_owned()
            } else {
                seen.join(", ")
            }
        ))
    }) else {
        return;
    };
    let Some(ctx) = steps.run("CUDA: create a context", || {
        Ok((cuda.context(dev).map_err(cu)?, "cuCtxCreate".to_owned()))
    }) else {
        return;
    };
    let bytes = options.bytes;
    if let Some(buffer) = steps.run("CUDA: allocate device memory", || {
        Ok((
            ctx.alloc(bytes).map_err(cu)?,
            format!("{} MiB", bytes >> 20),
        ))
    }) {
        steps.run("CUDA: write a pattern, read it back, compare", || {
            // A pattern no zeroed or stuck memory reproduces: each byte its offset's hash.
            let pattern: Vec<u8> = (0..bytes)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13).to_le_bytes()[0] ^ 0xA5)
                .collect();
            buffer.write(&pattern).map_err(cu)?;
            let mut back = vec![0u8; bytes];
            buffer.read(&mut back).map_err(cu)?;
            match pattern.iter().zip(&back).position(|(a, b)| a != b) {
                None => Ok(((), format!("{} MiB identical", bytes >> 20))),
                Some(at) => Err(format!(
                    "byte {at} reads back {:#04x}, {:#04x} written",
                    back[at], pattern[at]
                )),
            }
        });
        steps.run("CUDA: free the memory", || {
            buffer.free().map_err(cu)?;
            Ok(((), "cuMemFree".to_owned()))
        });
    }
    steps.run("CUDA: destroy the context", || {
        ctx.destroy().map_err(cu)?;
        Ok(((), "cuCtxDestroy".to_owned()))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_uuid_bytes_print_as_nvml_prints_them() {
        let bytes = [
            0x2d, 0xb2, 0xaa, 0x07, 0x65, 0xb0, 0x11, 0x02, 0x43, 0xca, 0x3c, 0xae, 0xc9, 0x77,
            0x8a, 0x8c,
        ];
        assert_eq!(
            uuid_text(&bytes),
            "GPU-2db2aa07-65b0-1102-43ca-3caec9778a8c"
        );
    }
}
