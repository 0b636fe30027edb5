//! Where GPUs sit: NUMA node, CPU affinity, PCIe common ancestor, boards and NVLinks.
//!
//! NVLinks are numbered per GPU in the order the node description lists them. A link number
//! of `NVML_NVLINK_MAX_LINKS` (18) or more is `INVALID_ARGUMENT`; a link the GPU does not have
//! is `NOT_SUPPORTED`, as on parts with fewer links (V100: 6, A100: 12). A link's far end is a
//! GPU (`NVML_NVLINK_DEVICE_TYPE_GPU` = 0) or an NVSwitch (`NVML_NVLINK_DEVICE_TYPE_SWITCH` = 2).
//! `nvmlDeviceGetCpuAffinity` fills `cpuSetSize` `unsigned long` words, CPU `n` at bit
//! `n % 64` of word `n / 64`; CPUs past the array are left out. `…WithinScope` and
//! `nvmlDeviceGetMemoryAffinity` do the same for `NVML_AFFINITY_SCOPE_NODE` (0) or `_SOCKET` (1);
//! another scope, a zero size or a NULL array is `INVALID_ARGUMENT` (`nvml.h` 4926-4990). A scope
//! the description does not give falls back to the narrower one, as NVML falls back to the
//! nearest non-I/O ancestor.

use std::ffi::{c_int, c_uint, c_ulong};

use super::device::pci_info;
use super::{Out, OutArray, device_call, guard};
use crate::abi::{
    AFFINITY_SCOPE_NODE, AFFINITY_SCOPE_SOCKET, NVLINK_MAX_LINKS, NvmlDevice, NvmlPciInfo,
    enable_state,
};
use crate::fields::MAX_CPU;
use crate::node::{self, NvLink, Remote};
use crate::state::Sim;
use crate::status::{NvmlError, NvmlReturn};

/// `NVML_NVLINK_DEVICE_TYPE_GPU`.
const NVLINK_DEVICE_GPU: c_uint = 0;
/// `NVML_NVLINK_DEVICE_TYPE_SWITCH`.
const NVLINK_DEVICE_SWITCH: c_uint = 2;

/// `nvmlDeviceGetNumaNodeId`: `NOT_SUPPORTED` when the description gives none.
///
/// # Safety
/// `node` is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device: NvmlDevice,
    node: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(node) };
        out.put(device_call(
            "nvmlDeviceGetNumaNodeId",
            device,
            out.ok(),
            |sim, i| sim.node.gpus[i].numa_node.ok_or(NvmlError::NotSupported),
        )?)
    })
}

/// `nvmlDeviceGetCpuAffinity`: the CPUs close to the GPU as a bitmask.
///
/// # Safety
/// `cpu_set` is NULL or writable for `cpu_set_size` `unsigned long`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device: NvmlDevice,
    cpu_set_size: c_uint,
    cpu_set: *mut c_ulong,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { OutArray::new(cpu_set, cpu_set_size) };
        let args_ok = out.ok() && cpu_set_size > 0;
        let words = device_call("nvmlDeviceGetCpuAffinity", device, args_ok, |sim, i| {
            let cpus = sim.node.gpus[i]
                .cpus
                .as_ref()
                .ok_or(NvmlError::NotSupported)?;
            Ok(cpu_words(cpus, (cpu_set_size as usize).min(MAX_WORDS)))
        })?;
        out.put_padded(&words, 0)
    })
}

/// The shared body of the two scoped affinity queries: `pick` chooses the list for a scope.
///
/// # Safety
/// `set` is NULL or writable for `size` `unsigned long`s.
unsafe fn scoped_affinity(
    function: &str,
    device: NvmlDevice,
    size: c_uint,
    set: *mut c_ulong,
    scope: c_uint,
    pick: impl FnOnce(&crate::node::Gpu, bool) -> Option<Vec<u32>>,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { OutArray::new(set, size) };
        let args_ok = out.ok()
            && size > 0
            && (scope == AFFINITY_SCOPE_NODE || scope == AFFINITY_SCOPE_SOCKET);
        let words = device_call(function, device, args_ok, |sim, i| {
            let list = pick(&sim.node.gpus[i], scope == AFFINITY_SCOPE_SOCKET)
                .ok_or(NvmlError::NotSupported)?;
            Ok(cpu_words(&list, (size as usize).min(MAX_WORDS)))
        })?;
        out.put_padded(&words, 0)
    })
}

/// `nvmlDeviceGetCpuAffinityWithinScope`: the CPUs of the GPU's NUMA node or socket.
///
/// # Safety
/// `cpu_set` is NULL or writable for `cpu_set_size` `unsigned long`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinityWithinScope(
    device: NvmlDevice,
    cpu_set_size: c_uint,
    cpu_set: *mut c_ulong,
    scope: c_uint,
) -> NvmlReturn {
    // SAFETY: the same contract, forwarded.
    unsafe {
        scoped_affinity(
            "nvmlDeviceGetCpuAffinityWithinScope",
            device,
            cpu_set_size,
            cpu_set,
            scope,
            |g, socket| {
                if socket {
                    g.affinity.socket_cpus.clone().or_else(|| g.cpus.clone())
                } else {
                    g.cpus.clone()
                }
            },
        )
    }
}

/// `nvmlDeviceGetMemoryAffinity`: the NUMA nodes near the GPU, or of its socket.
///
/// # Safety
/// `node_set` is NULL or writable for `node_set_size` `unsigned long`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: NvmlDevice,
    node_set_size: c_uint,
    node_set: *mut c_ulong,
    scope: c_uint,
) -> NvmlReturn {
    // SAFETY: the same contract, forwarded.
    unsafe {
        scoped_affinity(
            "nvmlDeviceGetMemoryAffinity",
            device,
            node_set_size,
            node_set,
            scope,
            |g, socket| {
                let node = g.affinity.memory_nodes.clone();
                if socket {
                    g.affinity.socket_memory_nodes.clone().or(node)
                } else {
                    node
                }
            },
        )
    }
}

/// Words enough for every CPU a node description may name; the rest of a larger array is zero.
const MAX_WORDS: usize = MAX_CPU as usize / c_ulong::BITS as usize + 1;

fn cpu_words(cpus: &[u32], words: usize) -> Vec<c_ulong> {
    let bits = c_ulong::BITS as usize;
    let mut out = vec![0; words];
    for &cpu in cpus {
        if let Some(word) = out.get_mut(cpu as usize / bits) {
            *word |= 1 << (cpu as usize % bits);
        }
    }
    out
}

/// Resolves the second device of a pair query and checks it is usable.
fn other(sim: &Sim, device: NvmlDevice, function: &str) -> Result<usize, NvmlError> {
    let j = sim.resolve(device)?;
    sim.usable(j, function)?;
    Ok(j)
}

/// `nvmlDeviceGetTopologyCommonAncestor`: an `nvmlGpuTopologyLevel_t`. Asking about a GPU and
/// itself is `INVALID_ARGUMENT`; a GPU without a PCIe placement is `NOT_SUPPORTED`.
///
/// # Safety
/// `path_info` is NULL or writable for one `nvmlGpuTopologyLevel_t` (`unsigned int`-sized).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: NvmlDevice,
    device2: NvmlDevice,
    path_info: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        const NAME: &str = "nvmlDeviceGetTopologyCommonAncestor";
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(path_info) };
        let level = device_call(NAME, device1, out.ok(), |sim, i| {
            let j = other(sim, device2, NAME)?;
            if i == j {
                return Err(NvmlError::InvalidArgument);
            }
            node::common_ancestor(&sim.node.gpus[i], &sim.node.gpus[j])
                .ok_or(NvmlError::NotSupported)
        })?;
        out.put(level as c_uint)
    })
}

/// `nvmlDeviceOnSameBoard`: 1 when both GPUs are on one multi-GPU board, else 0.
///
/// # Safety
/// `on_same_board` is NULL or writable for one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceOnSameBoard(
    device1: NvmlDevice,
    device2: NvmlDevice,
    on_same_board: *mut c_int,
) -> NvmlReturn {
    guard(|| {
        const NAME: &str = "nvmlDeviceOnSameBoard";
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(on_same_board) };
        let same = device_call(NAME, device1, out.ok(), |sim, i| {
            let j = other(sim, device2, NAME)?;
            let (a, b) = (&sim.node.gpus[i].board, &sim.node.gpus[j].board);
            Ok(a.is_some() && a == b)
        })?;
        out.put(c_int::from(same))
    })
}

/// The NVLink `link` of GPU `i`, with NVML's errors for a bad or absent link.
fn nvlink(sim: &Sim, i: usize, link: c_uint) -> Result<NvLink, NvmlError> {
    if link >= NVLINK_MAX_LINKS {
        return Err(NvmlError::InvalidArgument);
    }
    sim.node.gpus[i]
        .nvlinks
        .get(link as usize)
        .copied()
        .ok_or(NvmlError::NotSupported)
}

/// `nvmlDeviceGetNvLinkState`: `NVML_FEATURE_ENABLED` when the link is up.
///
/// # Safety
/// `is_active` is NULL or writable for one `nvmlEnableState_t` (`unsigned int`-sized).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: NvmlDevice,
    link: c_uint,
    is_active: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(is_active) };
        let l = device_call("nvmlDeviceGetNvLinkState", device, out.ok(), |sim, i| {
            nvlink(sim, i, link)
        })?;
        out.put(enable_state(l.active))
    })
}

/// `nvmlDeviceGetNvLinkRemotePciInfo_v2`: the PCI info of the GPU or NVSwitch at the far end.
///
/// # Safety
/// `pci` is NULL or writable for one `nvmlPciInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: NvmlDevice,
    link: c_uint,
    pci: *mut NvmlPciInfo,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(pci) };
        out.put(device_call(
            "nvmlDeviceGetNvLinkRemotePciInfo_v2",
            device,
            out.ok(),
            |sim, i| {
                Ok(match nvlink(sim, i, link)?.remote {
                    Remote::Gpu(j) => {
                        let g = &sim.node.gpus[j];
                        pci_info(g.pci, g.pci_device_id, g.pci_subsystem_id)
                    }
                    Remote::Switch(s) => {
                        let s = &sim.node.nvswitches[s];
                        pci_info(s.pci, s.device_id, 0)
                    }
                })
            },
        )?)
    })
}

/// `nvmlDeviceGetNvLinkRemoteDeviceType`: GPU (0) or NVSwitch (2).
///
/// # Safety
/// `device_type` is NULL or writable for one `nvmlIntNvLinkDeviceType_t` (`unsigned int`-sized).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: NvmlDevice,
    link: c_uint,
    device_type: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(device_type) };
        out.put(device_call(
            "nvmlDeviceGetNvLinkRemoteDeviceType",
            device,
            out.ok(),
            |sim, i| {
                Ok(match nvlink(sim, i, link)?.remote {
                    Remote::Gpu(_) => NVLINK_DEVICE_GPU,
                    Remote::Switch(_) => NVLINK_DEVICE_SWITCH,
                })
            },
        )?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_words_set_bits_and_drop_overflow() {
        assert_eq!(
            cpu_words(&[0, 1, 63, 64, 130], 2),
            vec![(1 << 63) | 0b11, 1]
        );
        assert_eq!(cpu_words(&[], 1), vec![0]);
    }
}
