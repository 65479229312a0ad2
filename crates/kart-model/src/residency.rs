//! Where a model's decoder layers live between uses. By default every layer's weights stay on the
//! device. A [`Residency`] instead brings a layer's weights to the device just before the layer
//! runs and drops them right after: from CPU memory (the offloaded reference policy,
//! [`CausalLm::offload_layers`]) or gathered from the ranks that each hold a slice (fully sharded
//! data parallelism, implemented by the trainer).
//!
//! Every pass runs each layer through [`CausalLm::with_layer`], so forward passes, cached decoding
//! and the recomputed backward pass of activation checkpointing all fetch and release alike.

use crate::transformer::CausalLm;

/// Brings decoder layers' weights to the device and takes them away again.
pub trait Residency: std::fmt::Debug + Send {
    /// Puts layer `layer`'s weights (its parameters' data) on the device.
    fn fetch(&self, layer: usize);

    /// Drops layer `layer`'s weights from the device (its parameters become empty).
    fn release(&self, layer: usize);

    /// Layer `layer`'s recomputed backward pass has left its gradients in its parameters (none
    /// when no gradient reached it); called before the layer is released.
    fn backward_done(&self, _layer: usize) {}

    /// Whether fetching is a collective of several ranks, so that every rank must fetch the same
    /// layers in the same order (a rank without tokens joins with [`CausalLm::idle_pass`]).
    fn collective(&self) -> bool {
        false
    }
}

impl CausalLm {
    /// Runs `f` on decoder layer `i`, its weights on the device meanwhile.
    pub(crate) fn with_layer<T>(&self, i: usize, f: impl FnOnce() -> T) -> T {
        let Some(residency) = self.residency() else { return f() };
        residency.fetch(i);
        let out = f();
        residency.release(i);
        out
    }

    /// Whether the layers' fetches are collectives every rank must join
    /// ([`Residency::collective`]).
    pub fn fetches_collectively(&self) -> bool {
        self.residency().is_some_and(|r| r.collective())
    }

    /// The fetches and releases of one forward pass, and with `backward` those of a recomputed
    /// backward pass, without computing anything: how a rank with nothing to compute joins the
    /// others' collective fetches.
    pub fn idle_pass(&self, backward: bool) {
        let Some(residency) = self.residency() else { return };
        for i in 0..self.num_layers() {
            residency.fetch(i);
            residency.release(i);
        }
        if backward {
            for i in (0..self.num_layers()).rev() {
                residency.fetch(i);
                residency.backward_done(i);
                residency.release(i);
            }
        }
    }

    /// Fetches every decoder layer, keeping them on the device when `keep` (a whole model to
    /// save or publish) and releasing each at once otherwise (a rank that only takes part in the
    /// gathering). Kept layers must be released ([`Self::release_layers`]) before the next pass.
    pub fn gather_layers(&self, keep: bool) {
        let Some(residency) = self.residency() else { return };
        for i in 0..self.num_layers() {
            residency.fetch(i);
            if !keep {
                residency.release(i);
            }
        }
    }

    /// Drops every decoder layer's weights from the device (after [`Self::gather_layers`]).
    pub fn release_layers(&self) {
        let Some(residency) = self.residency() else { return };
        for i in 0..self.num_layers() {
            residency.release(i);
        }
    }
}
