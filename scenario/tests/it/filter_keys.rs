//! The keys ParaDL's filter logs need, end to end from scenario text: `compute.host-synchronous`
//! (Chainer's `TimerHook`) and `parallelism.filter-backward` (ChainerMN's allgather backward).

use std::path::Path;

use scenario::Scenario;
use scenario::simulation::simulate;
use strategies::FilterBackward;

/// ResNet-50 (batch 32) filter-split over the 4 GPUs of one V100 server, with `extra` appended
/// to `[parallelism]` and `compute` as the `[compute]` table.
fn scenario(extra: &str, compute: &str) -> Scenario {
    let text = format!(
        "[cluster]\ndevice = \"v100-sxm2-16gb\"\nnodes = 1\ngpus-per-node = 4\n\
         intra-node = {{ kind = \"nvswitch\", bandwidth = \"50 GB/s\" }}\n\
         [workload]\nmodel = \"resnet50\"\nglobal-batch = 32\nmicro-batch = 32\nprecision = \"fp32\"\n\
         optimizer = \"adam\"\n[parallelism]\ndata = 1\nfilter = 4\n{extra}\n[compute]\n{compute}\n\
         [simulation]\nfidelity = \"analytical\"\n"
    );
    Scenario::parse(&text, Path::new("filter-keys.toml")).unwrap()
}

fn iteration(scenario: &Scenario) -> f64 {
    simulate(scenario).unwrap().summary.iteration_time.as_secs_f64()
}

#[test]
fn the_filter_keys_parse_and_change_the_step() {
    let textbook = scenario("", "");
    assert_eq!(textbook.parallelism.filter_backward, FilterBackward::InputAllreduce);
    assert!(!textbook.compute.host_synchronous);
    let chainermn = scenario("filter-backward = \"output-alltoall\"", "");
    assert_eq!(chainermn.parallelism.filter_backward, FilterBackward::OutputAlltoall);
    let synchronous = scenario("filter-backward = \"output-alltoall\"", "host-synchronous = true");
    assert!(synchronous.compute.host_synchronous);
    // The alltoall moves each rank's share of the output gradient once; the allreduce moved
    // the input gradient twice: different steps.
    let (textbook, chainermn, synchronous) =
        (iteration(&textbook), iteration(&chainermn), iteration(&synchronous));
    assert!((textbook - chainermn).abs() > 1e-6, "{textbook} vs {chainermn}");
    // A host that waits for every kernel pays at least one more dispatch per launch beyond the
    // first, and never less than the asynchronous host.
    assert!(synchronous > chainermn + 100.0 * 18.5e-6, "{synchronous} vs {chainermn}");
}

/// CUDA-aware MPI's staging through host memory is part of a message's transfer: the breakdown
/// counts it as communication (of the filter group), not as compute, whether it runs after the
/// transfer or, as Open MPI's fragments do, beside it.
#[test]
fn host_staging_counts_as_filter_communication() {
    let device = scenario("filter-backward = \"output-alltoall\"", "");
    let staged = scenario(
        "filter-backward = \"output-alltoall\"\ncnn-transport = \"mpi-managed\"\ncnn-staging-rate = \"1 GB/s\"",
        "",
    );
    let (device, staged) = (simulate(&device).unwrap().summary, simulate(&staged).unwrap().summary);
    // The same kernels either way: staging adds no compute.
    let compute = |s: &scenario::simulation::Summary| s.breakdown.compute.as_secs_f64();
    assert!(
        (compute(&device) - compute(&staged)).abs() < 1e-9 * compute(&device).max(1.0),
        "{} vs {}",
        compute(&device),
        compute(&staged)
    );
    // It is communication, mostly exposed (the filter layers wait for their outputs), and all of
    // it the filter group's.
    let exposed = staged.breakdown.exposed_communication.as_secs_f64();
    assert!(exposed > device.breakdown.exposed_communication.as_secs_f64() + 1e-3, "{exposed}");
    let filter = staged.breakdown.exposed_by_group.filter;
    assert!((filter - exposed).abs() < 1e-6 * exposed, "filter {filter} vs exposed {exposed}");
}
