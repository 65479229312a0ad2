//! The CPU tensors' peak counter, in a test binary of its own: the counter is one per process,
//! and tests of other modules allocating tensors on their threads would move the figures these
//! tests read. The tests here take turns.

use kart_torch::memory::cpu_peak;
use std::sync::Mutex;

/// Held by each test for its whole run: one test's reset must not fall inside another's window.
static COUNTER: Mutex<()> = Mutex::new(());

fn floats(len: i64) -> tch::Tensor {
    tch::Tensor::zeros([len], (tch::Kind::Float, tch::Device::Cpu))
}

#[test]
fn the_peak_counts_the_tensors_alive_at_once() {
    let _turn = COUNTER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    cpu_peak(true);
    let base = cpu_peak(true);
    let a = floats(1 << 20);
    let b = floats(1 << 20);
    drop((a, b));
    let c = floats(1 << 19);
    let peak = cpu_peak(true);
    assert!(peak >= base + (8 << 20) && peak < base + (9 << 20), "{peak} over {base}");
    assert!(cpu_peak(false) < base + (3 << 20), "a reset starts from what is alive");
    drop(c);
}

#[test]
fn raw_allocations_pass_through_the_counter() {
    let _turn = COUNTER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    cpu_peak(true);
    // oneDNN's bf16 matrix products take their scratch memory through PyTorch's raw interface,
    // which requires an allocator whose data pointers are their own contexts.
    let opts = (tch::Kind::BFloat16, tch::Device::Cpu);
    let x = tch::Tensor::ones([64, 512], opts);
    let w = tch::Tensor::ones([512, 512], opts);
    let y = x.linear::<tch::Tensor>(&w, None);
    assert_eq!(y.double_value(&[3, 7]), 512.0);
    let raw = floats(1 << 16);
    assert!(cpu_peak(false) >= 4 << 16, "{} bytes counted", cpu_peak(false));
    drop(raw);
}
