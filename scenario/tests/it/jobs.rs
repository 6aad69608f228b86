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

/// Spread, each job has two nodes in each leaf and both rings cross the single uplinks
/// together; packed (and pods), each job has a leaf of its own and no link is shared.
#[test]
fn jobs_sharing_an_oversubscribed_uplink_slow_down_and_jobs_in_their_own_leaf_do_not() {
    let spread = simulate(&jobs(TWO_JOBS, &[]).unwrap()).unwrap().summary;
    assert_eq!(spread.jobs[0].node_list, [0, 2, 4, 6]);
    for job in &spread.jobs {
        assert!(job.slowdown > 1.2, "{}: slowdown {}", job.name, job.slowdown);
        assert!(
            job.shared_s <= 2.0 * job.alone_s,
            "{}: {} shared, {} alone",
            job.name,
            job.shared_s,
            job.alone_s
        );
    }
    assert!(!spread.contended_links.is_empty());
    assert!(spread.contended_links.iter().all(|link| link.jobs == ["a", "b"]));
    for policy in ["packed", "pods"] {
        let setting = format!("placement.policy={policy:?}");
        let apart = simulate(&jobs(TWO_JOBS, &[&setting]).unwrap()).unwrap().summary;
        assert_eq!(apart.jobs[0].node_list, [0, 1, 2, 3], "{policy}");
        assert_eq!(apart.jobs[1].node_list, [4, 5, 6, 7], "{policy}");
        for job in &apart.jobs {
            assert!((job.slowdown - 1.0).abs() < 0.01, "{policy}: {}: slowdown {}", job.name, job.slowdown);
        }
        assert!(apart.contended_links.is_empty(), "{policy}");
    }
}

/// One job alone in `[[jobs]]`, on all the cluster's nodes, is the same scenario without
/// `[[jobs]]` (every rank simulated): the same iteration time to the picosecond.
#[test]
fn one_job_alone_is_the_scenario_without_jobs() {
    let one = TWO_JOBS.replace("[[jobs]]\nname = \"b\"\nnodes = 4\n", "").replace("nodes = 8", "nodes = 4");
    let summary = simulate(&jobs(&one, &[]).unwrap()).unwrap().summary;
    assert_eq!(summary.jobs.len(), 1);
    let plain: String = one.split("[placement]").next().unwrap().to_string();
    let table: toml::Table = toml::from_str(&plain).unwrap();
    let scenario = Scenario::from_table_with(
        &table,
        &["simulation.fold-symmetric-ranks=false".parse().unwrap()],
        Path::new("one.toml"),
        &Default::default(),
    )
    .unwrap();
    let alone = scenario::simulation::simulate(&scenario).unwrap().summary.iteration_time.as_secs_f64();
    assert_eq!(summary.jobs[0].alone_s, alone);
    assert_eq!(summary.jobs[0].shared_s, alone);
    assert_eq!(summary.jobs[0].slowdown, 1.0);
}

/// A job that starts 1 s later, with nothing in its way, takes the same time from its start
/// to the picosecond, so it ends exactly 1 s later.
#[test]
fn a_job_started_later_ends_exactly_that_much_later() {
    let at = |start: &str| {
        let text = TWO_JOBS.replace("name = \"b\"\n", &format!("name = \"b\"\nstart = \"{start}\"\n"));
        simulate(&jobs(&text, &["placement.policy=\"packed\""]).unwrap()).unwrap().summary
    };
    let (now, later) = (at("0 s"), at("1 s"));
    assert_eq!(later.jobs[1].start_s, 1.0);
    assert_eq!(later.jobs[1].shared_s, now.jobs[1].shared_s);
    assert_eq!(later.jobs[1].alone_s, now.jobs[1].alone_s);
    assert_eq!(later.jobs[0].shared_s, now.jobs[0].shared_s);
    assert!((later.makespan_s - (1.0 + now.jobs[1].shared_s)).abs() < 1e-12);
}

/// Placement policies give each job its nodes once: explicit lists first, then the policy
/// over the rest (random: the same seed, the same nodes).
#[test]
fn node_lists_and_random_placement() {
    let listed = TWO_JOBS.replace("name = \"a\"\nnodes = 4\n", "name = \"a\"\nnode-list = [7, 5, 3, 1]\n");
    let scenario = jobs(&listed, &["placement.policy=\"packed\""]).unwrap();
    assert_eq!(scenario.jobs[0].nodes, [7, 5, 3, 1]);
    assert_eq!(scenario.jobs[1].nodes, [0, 2, 4, 6]);
    let random = |seed: u64| {
        let scenario =
            jobs(TWO_JOBS, &["placement.policy=\"random\"", &format!("placement.seed={seed}")]).unwrap();
        scenario.jobs.iter().map(|job| job.nodes.clone()).collect::<Vec<_>>()
    };
    assert_eq!(random(3), random(3));
    let mut all: Vec<u32> = random(3).concat();
    all.sort_unstable();
    assert_eq!(all, (0..8).collect::<Vec<u32>>());
}

/// Bad job keys are refused, each naming its key.
#[test]
fn bad_jobs_are_refused_by_key() {
    let cases: [(String, &[&str], &str); 8] = [
        (
            TWO_JOBS
                .replace("name = \"a\"\nnodes = 4\n", "name = \"a\"\nnode-list = [0, 1]\n")
                .replace("name = \"b\"\nnodes = 4\n", "name = \"b\"\nnode-list = [1, 2]\n"),
            &[],
            "key `jobs[1].node-list`: names node 1, which jobs[0] (\"a\") has too",
        ),
        (
            TWO_JOBS.replace("nodes = 4\n\n[[jobs]]", "nodes = 5\n\n[[jobs]]"),
            &[],
            "key `jobs`: the jobs ask for 9 nodes in all, but the cluster has 8",
        ),
        (
            TWO_JOBS.replace("\"spread\"", "\"tight\""),
            &[],
            "key `placement.policy`: unknown placement policy \"tight\"",
        ),
        (TWO_JOBS.replace("\"flow\"", "\"analytical\""), &[], "key `simulation.fidelity`: is \"analytical\""),
        (
            TWO_JOBS.to_string() + "\n[variability]\nslow-ranks = { ranks = [8], factor = 2.0 }\n",
            &[],
            "key `variability.slow-ranks.ranks`: names rank 8, but the job has ranks 0 to 7",
        ),
        (
            TWO_JOBS.replace(
                "name = \"b\"\nnodes = 4\n",
                "name = \"b\"\nnodes = 4\n[jobs.workload]\nmodel = \"resnet51\"\n",
            ),
            &[],
            "key `jobs[1].workload.model`",
        ),
        (
            TWO_JOBS.replace("name = \"b\"\n", "name = \"a\"\n"),
            &[],
            "key `jobs[1].name`: \"a\" is also the name of jobs[0]",
        ),
        (
            TWO_JOBS.replace("name = \"b\"\nnodes = 4", "name = \"b\"\nnodes = 4\ngpus = 4"),
            &[],
            "key `jobs[1].gpus`: unknown field `gpus`",
        ),
    ];
    for (text, overrides, expected) in cases {
        let error = jobs(&text, overrides).unwrap_err().to_string();
        assert!(error.contains(expected), "expected {expected:?} in: {error}");
    }
}

/// A scenario with several jobs read as one job (by `sweep`, `plan`, ...) is refused naming
/// `jobs` and the command that runs it; its fabric reads as a cluster (`parasim topo`).
#[test]
fn one_job_readers_name_jobs_and_the_fabric_reads_as_a_cluster() {
    let error = Scenario::parse(TWO_JOBS, Path::new("jobs.toml")).unwrap_err().to_string();
    assert!(error.starts_with("jobs.toml: key `jobs`: several jobs on one fabric"), "{error}");
    let cluster = scenario::Cluster::parse(TWO_JOBS, Path::new("jobs.toml")).unwrap();
    assert_eq!(cluster.spec.nodes, 8);
}

/// `[faults]` hit the fabric, for the jobs together and alone: the leaves' uplinks at half
/// rate make the spread jobs slower alone and shared, and leave the packed jobs, which never
/// climb to the spine, as they were.
#[test]
fn faults_hit_the_fabric_for_every_run() {
    let faulty = TWO_JOBS.to_string()
        + "\n[faults]\nlinks = [{ kind = \"leaf-spine\", fraction = 1.0, bandwidth-factor = 0.5 }]\n";
    let run = |text: &str, policy: &str| {
        let setting = format!("placement.policy={policy:?}");
        simulate(&jobs(text, &[&setting]).unwrap()).unwrap().summary.jobs[0].clone()
    };
    let (sound, hit) = (run(TWO_JOBS, "spread"), run(&faulty, "spread"));
    assert!(hit.alone_s > sound.alone_s, "{} alone with faults, {} without", hit.alone_s, sound.alone_s);
    assert!(hit.shared_s > sound.shared_s);
    let (sound, hit) = (run(TWO_JOBS, "packed"), run(&faulty, "packed"));
    assert_eq!(hit.alone_s, sound.alone_s);
    assert_eq!(hit.shared_s, sound.shared_s);
    let unknown =
        TWO_JOBS.to_string() + "\n[faults]\nlinks = [{ kind = \"warp\", fraction = 1.0, down = true }]\n";
    let error = simulate(&jobs(&unknown, &[]).unwrap()).err().unwrap().to_string();
    assert!(error.contains("faults.links[0]"), "{error}");
}

/// `[variability]` re-times each job's iterations from the shared run: with draws that change
/// nothing every iteration is the shared run's (a later start not counted in the first), a
/// named 2x straggler slows only the job whose GPU it is, and the same seed gives the same
/// distribution.
#[test]
fn variability_retimes_each_jobs_iterations_and_only_the_straggling_job_slows() {
    let base = TWO_JOBS
        .replace("\"spread\"", "\"packed\"")
        .replace("fidelity = \"flow\"", "fidelity = \"flow\"\niterations = 6\nseed = 5");
    let with = |variability: &str, start: &str| {
        let text = base.replace("name = \"b\"\n", &format!("name = \"b\"\nstart = {start:?}\n"))
            + "\n[variability]\n"
            + variability;
        simulate(&jobs(&text, &[]).unwrap()).unwrap().summary
    };
    // Factor 1 for a named rank: active, changes nothing.
    let still = with("slow-ranks = { ranks = [0], factor = 1.0 }\n", "3 ms");
    for job in &still.jobs {
        let d = job.distribution.as_ref().expect("a distribution");
        assert_eq!(d.iterations, 6);
        assert!((d.mean_s / d.nominal_s - 1.0).abs() < 1e-9, "{}: {} vs {}", job.name, d.mean_s, d.nominal_s);
        assert!(
            (d.max_s / d.nominal_s - 1.0).abs() < 1e-3,
            "{}: max {} vs {}",
            job.name,
            d.max_s,
            d.nominal_s
        );
        assert!((job.shared_s / (6.0 * d.nominal_s) - 1.0).abs() < 1e-9, "{}", job.name);
    }
    // GPU 0 is job a's (packed: nodes 0-3): a waits for it, b does not.
    let slow = with("slow-ranks = { ranks = [0], factor = 2.0 }\n", "0 s");
    let (a, b) = (slow.jobs[0].distribution.as_ref().unwrap(), slow.jobs[1].distribution.as_ref().unwrap());
    // Communication dominates these steps: a 2x slower GPU adds its compute time once more.
    assert!(a.slowdown > 1.05, "a: {}", a.slowdown);
    assert!((b.slowdown - 1.0).abs() < 1e-9, "b: {}", b.slowdown);
    // Noise: reproducible by seed, different by seed.
    let noise = "op-noise = { distribution = \"lognormal\", cv = 0.3 }\n";
    let once = with(noise, "0 s");
    let again = with(noise, "0 s");
    let text = |s: &scenario::jobs::JobsSummary| serde_json::to_string(&s.jobs).unwrap();
    assert_eq!(text(&once), text(&again));
    let other =
        simulate(&jobs(&(base.replace("seed = 5", "seed = 6") + "\n[variability]\n" + noise), &[]).unwrap())
            .unwrap()
            .summary;
    assert_ne!(text(&once), text(&other));
    assert!(
        once.jobs
            .iter()
            .all(|job| job.distribution.as_ref().unwrap().p99_s >= job.distribution.as_ref().unwrap().p50_s)
    );
}

/// `[failures]` over the fabric: each job's goodput counts the failures of its own GPUs and
/// nodes (a named node failure strikes only the job on that node), its components are its
/// own, and a link the fabric does not have is refused by key.
#[test]
fn failures_strike_the_job_whose_components_fail() {
    let base = TWO_JOBS.replace("\"spread\"", "\"packed\"");
    let failures = "\n[failures]\nresponse = \"checkpoint-restart\"\nrestart-minutes = 10\n\
                    checkpoint-bandwidth = \"10 GB/s\"\ncheckpoint-interval = 1000\nhours = 24\n\
                    [[failures.events]]\nat-hours = 5\nkind = \"node\"\nnode = 6\n";
    let summary = simulate(&jobs(&(base.clone() + failures), &[]).unwrap()).unwrap().summary;
    let (a, b) = (summary.jobs[0].goodput.as_ref().unwrap(), summary.jobs[1].goodput.as_ref().unwrap());
    assert_eq!(summary.jobs[1].node_list, [4, 5, 6, 7]);
    assert_eq!((a.failures.node, b.failures.node), (0, 1));
    assert_eq!((a.components.gpus, a.components.nodes), (4, 4));
    assert!(a.fraction > b.fraction, "a {} b {}", a.fraction, b.fraction);
    // The struck job loses a restart and the work since its last checkpoint.
    assert!(b.lost_hours_restart > 0.16 && b.lost_hours_restart < 0.17, "{}", b.lost_hours_restart);
    assert_eq!(a.lost_hours_restart, 0.0);
    let bad = failures.replace("kind = \"node\"\nnode = 6", "kind = \"link\"\nlink = \"no such link\"");
    let error = simulate(&jobs(&(base + &bad), &[]).unwrap()).err().unwrap().to_string();
    assert!(error.contains("failures.events[0].link"), "{error}");
}
