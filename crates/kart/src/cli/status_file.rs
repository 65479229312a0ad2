//! A command's final report for its orchestrator: written to `$KART_STATUS_FILE` when set (the
//! operator points it at the container's termination message, `/dev/termination-log`).

use anyhow::Context;

/// Writes `report` as JSON to `$KART_STATUS_FILE`, if set.
pub fn write(report: &impl serde::Serialize) -> anyhow::Result<()> {
    let Some(path) = std::env::var_os("KART_STATUS_FILE") else {
        return Ok(());
    };
    let text = serde_json::to_string(report)?;
    std::fs::write(&path, text).with_context(|| format!("KART_STATUS_FILE {}", path.to_string_lossy()))
}
