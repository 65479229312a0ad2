//! kart-operator: the Kubernetes operator that reconciles kart's Retriever, RolloutPool and
//! TrainingJob custom resources into workloads. It depends on `kart` without default features, for
//! the shared configuration types only, and never links libtorch.
