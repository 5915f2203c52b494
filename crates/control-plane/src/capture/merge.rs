//! The labelled merge of a capture, pure: [`merge_responses`] turns the
//! agents' answers into the session's [`Outcome`] (its final status, the
//! merged profile, every failure and the requests served), enforcing the
//! per-isolate bounds of [`Limits`]. No IO, no clock: table-tested below.

use std::collections::{BTreeMap, HashMap, HashSet};

use edgeprof_proto::rest::{Failure, SessionStatus, Target};
use edgeprof_proto::v1;

use super::CaptureSpec;
use crate::text::{MAX_STORED_ERROR_BYTES, truncate};

/// Bounds on what one capture accepts from agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest profile of one isolate as sent (gzip'd bytes).
    pub max_profile_bytes: usize,
    /// Largest profile of one isolate once inflated.
    pub max_inflated_bytes: u64,
    /// Most bytes of answers held for one capture, over all agents.
    pub max_capture_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_profile_bytes: 16 << 20,
            max_inflated_bytes: 32 << 20,
            max_capture_bytes: 256 << 20,
        }
    }
}

/// A machine's answer: its response, or why there is none.
pub type Answer = (String, Result<v1::CaptureResponse, String>);

/// How a capture ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `done`, `partial` or `failed`.
    pub status: SessionStatus,
    /// The merged, encoded profile (`None` when failed).
    pub profile: Option<Vec<u8>>,
    /// Every machine or isolate that gave no profile.
    pub failures: Vec<Failure>,
    /// Requests the merged isolates served (`None`: some agent does not
    /// count them, or nothing was merged).
    pub requests: Option<u64>,
    /// Why it failed.
    pub error: Option<String>,
    /// What the final state change says (`no profile from …` when partial).
    pub detail: Option<String>,
}

/// Longest session error stored (it joins the failures' reasons).
pub const MAX_SESSION_ERROR_BYTES: usize = 8 * 1024;

/// A failure reason from an agent, bounded for storage.
pub fn bounded(reason: &str) -> String {
    truncate(reason, MAX_STORED_ERROR_BYTES)
}

/// Bytes an answer holds (profiles and error strings).
pub fn answer_bytes(resp: &v1::CaptureResponse) -> usize {
    resp.isolates
        .iter()
        .map(|i| i.pprof.len() + i.error.len())
        .sum()
}

/// Merges the answers of a capture of `spec`, labelling every sample with
/// its data center, machine, isolate (and Durable Object), and accounting
/// for every target that gave no profile. Isolates not asked for are
/// ignored; machine-level failures come in as `Err` answers.
pub fn merge_responses(spec: &CaptureSpec, answers: &[Answer], limits: &Limits) -> Outcome {
    let mut by_machine: BTreeMap<&str, Vec<&Target>> = BTreeMap::new();
    for t in &spec.targets {
        by_machine.entry(t.machine.as_str()).or_default().push(t);
    }
    let dc_of = |machine: &str| {
        by_machine
            .get(machine)
            .map(|t| t[0].data_center.clone())
            .unwrap_or_default()
    };
    let wanted: HashMap<(&str, &str), &Target> = spec
        .targets
        .iter()
        .map(|t| ((t.machine.as_str(), t.isolate.as_str()), t))
        .collect();
    let mut failures = Vec::new();
    let mut merger = edgeprof_pprof::Merger::new();
    let mut requests: Option<u64> = Some(0);
    for (machine, answer) in answers {
        let dc = dc_of(machine);
        let resp = match answer {
            Ok(r) => r,
            Err(reason) => {
                failures.push(Failure {
                    machine: machine.clone(),
                    data_center: dc,
                    isolate: None,
                    reason: bounded(reason),
                });
                continue;
            }
        };
        let mut returned = HashSet::new();
        for iso in &resp.isolates {
            let Some(target) = wanted.get(&(machine.as_str(), iso.isolate_id.as_str())) else {
                continue; // not asked for: never mix in other isolates
            };
            if !returned.insert(iso.isolate_id.as_str()) {
                continue; // answered twice: the first answer counts
            }
            let fail = |reason: String| Failure {
                machine: machine.clone(),
                data_center: dc.clone(),
                isolate: Some(iso.isolate_id.clone()),
                reason: bounded(&reason),
            };
            if !iso.error.is_empty() {
                failures.push(fail(iso.error.clone()));
                continue;
            }
            if iso.pprof.len() > limits.max_profile_bytes {
                failures.push(fail(format!(
                    "profile too large: {} bytes, over the limit of {} bytes per isolate",
                    iso.pprof.len(),
                    limits.max_profile_bytes
                )));
                continue;
            }
            let profile =
                match edgeprof_pprof::decode_with_limit(&iso.pprof, limits.max_inflated_bytes) {
                    Ok(p) => p,
                    Err(e) => {
                        failures.push(fail(format!(
                            "unreadable profile (at most {} bytes inflated per isolate): {e}",
                            limits.max_inflated_bytes
                        )));
                        continue;
                    }
                };
            let dobj = spec
                .durable_object
                .as_ref()
                .map(ToString::to_string)
                .or_else(|| {
                    let dos = if iso.durable_objects.is_empty() {
                        &target.durable_objects
                    } else {
                        &iso.durable_objects
                    };
                    (!dos.is_empty()).then(|| dos.join(","))
                });
            let mut labels: Vec<(&str, &str)> = vec![
                ("data_center", dc.as_str()),
                ("machine", machine.as_str()),
                ("isolate", iso.isolate_id.as_str()),
            ];
            if let Some(d) = &dobj {
                labels.push(("durable_object", d.as_str()));
            }
            match merger.add_labeled(&profile, &labels) {
                Ok(()) => requests = requests.zip(iso.requests).map(|(a, b)| a.saturating_add(b)),
                Err(e) => failures.push(fail(format!("cannot merge: {e}"))),
            }
        }
        for t in by_machine.get(machine.as_str()).into_iter().flatten() {
            if !returned.contains(t.isolate.as_str()) {
                failures.push(Failure {
                    machine: machine.clone(),
                    data_center: dc.clone(),
                    isolate: Some(t.isolate.clone()),
                    reason: "the agent returned no profile for this isolate".into(),
                });
            }
        }
    }
    let failed = |error: String, failures: Vec<Failure>| Outcome {
        status: SessionStatus::Failed,
        profile: None,
        failures,
        requests: None,
        error: Some(truncate(&error, MAX_SESSION_ERROR_BYTES)),
        detail: None,
    };
    if merger.is_empty() {
        let reasons: Vec<String> = failures
            .iter()
            .map(|f| match &f.isolate {
                Some(i) => format!("{} (isolate {i}): {}", f.machine, f.reason),
                None => format!("{}: {}", f.machine, f.reason),
            })
            .collect();
        return failed(
            format!("no target returned a profile: {}", reasons.join("; ")),
            failures,
        );
    }
    let mut merged = match merger.finish() {
        Ok(p) => p,
        Err(e) => return failed(format!("cannot merge the profiles: {e}"), failures),
    };
    if let Some(n) = requests {
        edgeprof_pprof::add_comment(&mut merged, &format!("requests: {n}"));
    }
    let (status, detail) = if failures.is_empty() {
        (SessionStatus::Done, None)
    } else {
        let mut names: Vec<&str> = failures.iter().map(|f| f.machine.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let detail = format!("no profile from {}", names.join(", "));
        (SessionStatus::Partial, Some(detail))
    };
    Outcome {
        status,
        profile: Some(edgeprof_pprof::encode(&merged)),
        failures,
        requests,
        error: None,
        detail,
    }
}

#[cfg(test)]
mod tests;
