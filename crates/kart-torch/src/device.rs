//! The device a component runs on: chosen from its config, checked, and logged.

use kart_core::config::train::Device;

/// A device asked for that this machine does not have.
#[derive(Debug, thiserror::Error)]
#[error("{field} = {value}: {reason}")]
pub struct DeviceError {
    pub field: String,
    pub value: String,
    pub reason: String,
}

/// The device `component` runs on, for `device` as configured at `field`, on this process's
/// local rank: `cuda` without a usable GPU is an error, `auto` falls back to the CPU with a
/// warning. Logs the choice.
pub fn choose(
    component: &str,
    field: &str,
    device: Device,
    local_rank: usize,
) -> Result<tch::Device, DeviceError> {
    let gpus = usize::try_from(tch::Cuda::device_count()).unwrap_or(0);
    let chosen = match (device, gpus) {
        (Device::Cpu, _) => tch::Device::Cpu,
        (Device::Cuda | Device::Auto, n) if local_rank < n => tch::Device::Cuda(local_rank),
        (Device::Cuda, n) => {
            let reason = match n {
                0 if crate::Runtime::probe().cuda.loaded => {
                    "no CUDA device is visible (driver or GPU missing)".into()
                }
                0 => "this kart binary's libtorch has no CUDA support".into(),
                n => format!("local rank {local_rank} needs a GPU of its own, and {n} are visible"),
            };
            return Err(DeviceError { field: field.into(), value: "cuda".into(), reason });
        }
        (Device::Auto, n) => {
            tracing::warn!(
                component,
                gpus = n,
                local_rank,
                "no CUDA device for this rank: running on the CPU"
            );
            tch::Device::Cpu
        }
    };
    tracing::info!(component, device = ?chosen, "device chosen");
    Ok(chosen)
}

/// The device `component` runs on when it is not configured: the first GPU, else the CPU.
pub fn auto(component: &str) -> tch::Device {
    choose(component, "device", Device::Auto, 0).expect("`auto` always finds a device")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_always_there_and_cuda_must_be() {
        assert_eq!(choose("test", "device", Device::Cpu, 0).unwrap(), tch::Device::Cpu);
        let gpus = tch::Cuda::device_count() as usize;
        let auto = choose("test", "device", Device::Auto, gpus).unwrap();
        assert_eq!(auto, tch::Device::Cpu, "a rank past the GPUs falls back to the CPU");
        let err = choose("test", "device", Device::Cuda, gpus).unwrap_err().to_string();
        assert!(err.starts_with("device = cuda: "), "{err}");
    }
}
