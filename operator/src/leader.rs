//! Leader election on a `coordination.k8s.io/v1` Lease: one operator replica reconciles, the
//! others wait until the holder stops renewing.
//!
//! A candidate takes the Lease when nobody holds it or the holder's `renewTime` is older than
//! `leaseDurationSeconds`; writes carry the read `resourceVersion`, so of two candidates racing
//! only one succeeds (the other gets a conflict). The leader renews every third of the duration
//! and gives the Lease up on shutdown.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use std::time::Duration;

/// Failures of a Lease operation other than losing a race.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lease {name}: {source}")]
    Api { name: String, source: kube::Error },
}

/// A Lease this process competes for.
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl LeaseLock {
    /// Lease `name` in `namespace`, held as `identity` for `duration` per renewal.
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, duration: Duration) -> Self {
        LeaseLock {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            duration,
        }
    }

    /// How often the leader renews.
    pub fn renew_interval(&self) -> Duration {
        self.duration / 3
    }

    /// Takes or renews the Lease; `Ok(false)` when another holder's Lease is still valid or a
    /// concurrent write won.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, LeaderError> {
        let err = |source| LeaderError::Api { name: self.name.clone(), source };
        let now = jiff::Timestamp::now();
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.name).await.map_err(err)? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return conflict_is_false(self.api.create(&PostParams::default(), &lease).await).map_err(err);
        };
        let spec = lease.spec.get_or_insert_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(self.identity.as_str());
        let valid_for =
            Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(seconds)).unwrap_or(0));
        let expired = spec.renew_time.as_ref().is_none_or(|t| {
            t.0 + jiff::SignedDuration::try_from(valid_for).unwrap_or(jiff::SignedDuration::MAX) < now
        });
        if holder.is_some() && !ours && !expired {
            return Ok(false);
        }
        if !ours {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(seconds);
        spec.renew_time = Some(MicroTime(now));
        conflict_is_false(self.api.replace(&self.name, &PostParams::default(), &lease).await).map_err(err)
    }

    /// Gives the Lease up if this process holds it.
    pub async fn release(&self) -> Result<(), LeaderError> {
        let err = |source| LeaderError::Api { name: self.name.clone(), source };
        let Some(mut lease) = self.api.get_opt(&self.name).await.map_err(err)? else { return Ok(()) };
        let spec = lease.spec.get_or_insert_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        conflict_is_false(self.api.replace(&self.name, &PostParams::default(), &lease).await).map_err(err)?;
        Ok(())
    }

    /// Waits until this process holds the Lease, trying every `retry`; a failed try (the API
    /// server unreachable or slow) is logged and tried again, as client-go's elector does.
    pub async fn acquire(&self, retry: Duration) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "acquiring the lease failed; trying again"),
            }
            tokio::time::sleep(retry).await;
        }
    }

    /// Renews until a renewal fails for longer than the Lease's duration (leadership lost);
    /// returns then.
    pub async fn keep(&self) {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.renew_interval()).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::error!(lease = %self.name, "another replica took the lease");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "renewing the lease failed"),
            }
            if last_renewal.elapsed() > self.duration {
                tracing::error!(lease = %self.name, "the lease could not be renewed in time");
                return;
            }
        }
    }
}

/// A conflict (another writer won) as `Ok(false)`.
fn conflict_is_false<T>(result: Result<T, kube::Error>) -> Result<bool, kube::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}
