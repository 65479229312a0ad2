//! Dropping a tensor's gradient: tch zeroes gradients but cannot undefine one, so a gradient once
//! computed keeps its memory. Sharded training frees a parameter's full gradient once its shard
//! has been taken.

use crate::ffi;
use std::ffi::c_void;
use tch::Tensor;

/// Undefines `tensor`'s gradient, releasing its memory (a later backward pass defines it anew).
pub fn clear(tensor: &Tensor) {
    // SAFETY: `tensor` is a live at::Tensor; the shim only resets its gradient.
    let error = unsafe { ffi::kart_clear_grad(tensor.as_ptr() as *mut c_void) };
    if let Err(message) = ffi::check(error) {
        unreachable!("resetting a gradient cannot fail: {message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    #[test]
    fn a_cleared_gradient_is_undefined_and_comes_back_with_the_next_backward() {
        let p = Tensor::from_slice(&[1.0f32, 2.0]).set_requires_grad(true);
        (&p * 3.0).sum(Kind::Float).backward();
        assert!(p.grad().defined());
        clear(&p);
        assert!(!p.grad().defined());
        (&p * &p).sum(Kind::Float).backward();
        assert_eq!(Vec::<f32>::try_from(p.grad()).unwrap(), [2.0, 4.0], "not added to the old one");
    }
}
