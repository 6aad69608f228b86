//! Synthetic Kineto traces of a data-parallel training loop, of any size, for tests and
//! benchmarks (import speed and memory, replay invariants).
//!
//! Each rank runs `steps` iterations of `layers` kernels on the compute stream (stream 7),
//! launched by the main thread; every `layers_per_bucket` kernels the communication stream
//! (stream 20) waits for the compute stream (`cudaStreamWaitEvent`) and all-reduces a bucket
//! (an NCCL kernel with PyTorch 2.2+ collective arguments, issued inside `record_param_comms`
//! and `nccl:all_reduce`); the step ends with the compute stream waiting for the last
//! allreduce, an optimizer kernel and a `cudaDeviceSynchronize`. Every launch is preceded by
//! `cpu_op` events carrying the shapes and stacks real traces carry, so the file's mix of
//! events (most of them host-side) and its bytes per GPU op resemble a real one. Everything is
//! written as it is generated: a 1 GB trace takes no memory to make.

use std::io::{self, Write};

/// The shape of a synthetic job.
#[derive(Debug, Clone)]
pub struct SyntheticJob {
    /// Ranks (one file each).
    pub world_size: u32,
    /// Iterations.
    pub steps: u32,
    /// Compute kernels per iteration.
    pub layers: u32,
    /// Compute kernels per allreduce bucket.
    pub layers_per_bucket: u32,
    /// Duration of each compute kernel (µs).
    pub kernel_us: f64,
    /// Host time between launches (µs).
    pub launch_gap_us: f64,
    /// Elements (fp32) all-reduced per bucket.
    pub bucket_elements: u64,
    /// Measured duration of each allreduce kernel (µs).
    pub allreduce_us: f64,
    /// Host-side `cpu_op` events per launch (file bulk).
    pub cpu_ops_per_launch: u32,
    /// Whether buckets are all-reduced at all (without, a replay must reproduce the measured
    /// iteration times exactly: nothing in it is simulated).
    pub allreduce: bool,
}

impl Default for SyntheticJob {
    fn default() -> Self {
        SyntheticJob {
            world_size: 2,
            steps: 3,
            layers: 40,
            layers_per_bucket: 10,
            kernel_us: 50.0,
            launch_gap_us: 10.0,
            bucket_elements: 1 << 20,
            allreduce_us: 400.0,
            cpu_ops_per_launch: 3,
            allreduce: true,
        }
    }
}

impl SyntheticJob {
    /// The job with `steps` chosen so one rank's file is about `bytes` long.
    pub fn sized(bytes: u64) -> SyntheticJob {
        let job = SyntheticJob { world_size: 1, steps: 1, ..SyntheticJob::default() };
        let per_step = job.bytes_per_step();
        SyntheticJob { steps: (bytes / per_step).max(1) as u32, ..job }
    }

    /// Approximate bytes one step adds to a rank's file.
    fn bytes_per_step(&self) -> u64 {
        let mut counter = io::sink();
        let mut counting = CountingWriter { inner: &mut counter, bytes: 0 };
        let one = SyntheticJob { steps: 1, ..self.clone() };
        // Writing to a sink cannot fail.
        let _ = one.write_rank(0, &mut counting);
        counting.bytes.max(1)
    }

    /// Writes rank `rank`'s Kineto JSON to `out`.
    pub fn write_rank(&self, rank: u32, out: &mut impl Write) -> io::Result<()> {
        let mut out = io::BufWriter::with_capacity(1 << 16, out);
        writeln!(
            out,
            "{{\"schemaVersion\": 1, \"deviceProperties\": [{{\"id\": 0, \"name\": \"NVIDIA A100-SXM4-80GB\", \
             \"totalGlobalMem\": 85899345920, \"computeMajor\": 8, \"computeMinor\": 0, \"numSms\": 108}}], \
             \"distributedInfo\": {{\"backend\": \"nccl\", \"rank\": {rank}, \"world_size\": {}}}, \
             \"traceEvents\": [",
            self.world_size
        )?;
        let host = 1000 + u64::from(rank);
        let mut clock = 1_000_000.0_f64; // host time, µs
        let mut compute_free = clock; // when the compute stream is next free
        let mut comm_free = clock;
        let mut correlation = 1u64;
        let mut external = 1u64;
        let mut first = true;
        let mut event = |out: &mut io::BufWriter<&mut _>, text: String| -> io::Result<()> {
            if !first {
                out.write_all(b",\n")?;
            }
            first = false;
            out.write_all(text.as_bytes())
        };
        for step in 0..self.steps {
            let step_start = clock;
            let mut pending: Vec<String> = Vec::new();
            let mut last_allreduce_end = compute_free;
            for layer in 0..self.layers {
                for op in 0..self.cpu_ops_per_launch {
                    external += 1;
                    event(
                        &mut out,
                        format!(
                            "{{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::op_{op}\", \"pid\": {host}, \"tid\": {host}, \
                             \"ts\": {:.3}, \"dur\": 2.5, \"args\": {{\"External id\": {external}, \"Sequence number\": {}, \
                             \"Fwd thread id\": 0, \"Input Dims\": [[64, 256, 56, 56], [256], [256], []], \
                             \"Input type\": [\"float\", \"float\", \"float\", \"Scalar\"], \
                             \"Call stack\": \"train.py(120): step;model.py(42): forward;torch/nn/modules/module.py(1501): _call_impl\"}}}}",
                            clock,
                            step * 1000 + layer
                        ),
                    )?;
                    clock += 2.6;
                }
                // Launch a compute kernel.
                correlation += 1;
                event(
                    &mut out,
                    runtime_call(host, "cudaLaunchKernel", 211, clock, 4, correlation, Some(external)),
                )?;
                let start = (clock + 3.0).max(compute_free);
                pending.push(format!(
                    "{{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"void synthetic_layer_kernel<float, 128>(float const*, float*, int)\", \
                     \"pid\": 0, \"tid\": 7, \"ts\": {start:.3}, \"dur\": {:.3}, \"args\": {{\"queued\": 0, \"device\": 0, \
                     \"context\": 1, \"stream\": 7, \"correlation\": {correlation}, \"External id\": {external}, \
                     \"registers per thread\": 64, \"shared memory\": 0, \"grid\": [1024, 1, 1], \"block\": [128, 1, 1]}}}}",
                    self.kernel_us
                ));
                compute_free = start + self.kernel_us;
                clock += 4.0 + self.launch_gap_us;
                // A bucket is ready: the communication stream waits and all-reduces it.
                if self.allreduce
                    && ((layer + 1) % self.layers_per_bucket.max(1) == 0 || layer + 1 == self.layers)
                {
                    external += 1;
                    let nelems = self.bucket_elements;
                    let comms_args = format!(
                        "\"Collective name\": \"allreduce\", \"In msg nelems\": {nelems}, \"Out msg nelems\": {nelems}, \
                         \"Group size\": {}, \"dtype\": \"Float\", \"Process Group Name\": \"0\", \
                         \"Process Group Description\": \"default_pg\", \"Process Group Ranks\": \"[{}]\"",
                        self.world_size,
                        (0..self.world_size).map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
                    );
                    event(
                        &mut out,
                        format!(
                            "{{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"record_param_comms\", \"pid\": {host}, \"tid\": {host}, \
                             \"ts\": {clock:.3}, \"dur\": 30, \"args\": {{\"External id\": {external}, {comms_args}}}}}"
                        ),
                    )?;
                    event(
                        &mut out,
                        format!(
                            "{{\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"nccl:all_reduce\", \"pid\": {host}, \"tid\": {host}, \
                             \"ts\": {:.3}, \"dur\": 25, \"args\": {{\"External id\": {}}}}}",
                            clock + 1.0,
                            external + 1
                        ),
                    )?;
                    correlation += 1;
                    event(
                        &mut out,
                        runtime_call(host, "cudaStreamWaitEvent", 147, clock + 2.0, 2, correlation, None),
                    )?;
                    correlation += 1;
                    event(
                        &mut out,
                        runtime_call(
                            host,
                            "cudaLaunchKernel",
                            211,
                            clock + 5.0,
                            5,
                            correlation,
                            Some(external),
                        ),
                    )?;
                    let start = (clock + 8.0).max(compute_free).max(comm_free);
                    pending.push(format!(
                        "{{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)\", \
                         \"pid\": 0, \"tid\": 20, \"ts\": {start:.3}, \"dur\": {:.3}, \"args\": {{\"queued\": 0, \"device\": 0, \
                         \"context\": 1, \"stream\": 20, \"correlation\": {correlation}, \"External id\": {external}, {comms_args}}}}}",
                        self.allreduce_us
                    ));
                    comm_free = start + self.allreduce_us;
                    last_allreduce_end = comm_free;
                    clock += 31.0;
                }
            }
            // The compute stream waits for the last allreduce; optimizer; synchronize.
            correlation += 1;
            event(&mut out, runtime_call(host, "cudaStreamWaitEvent", 147, clock, 2, correlation, None))?;
            clock += 3.0;
            correlation += 1;
            event(&mut out, runtime_call(host, "cudaLaunchKernel", 211, clock, 4, correlation, None))?;
            let start = (clock + 3.0).max(compute_free).max(last_allreduce_end);
            pending.push(format!(
                "{{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"void synthetic_optimizer_kernel(float*, float const*, int)\", \
                 \"pid\": 0, \"tid\": 7, \"ts\": {start:.3}, \"dur\": 100, \"args\": {{\"device\": 0, \"stream\": 7, \"correlation\": {correlation}}}}}"
            ));
            compute_free = start + 100.0;
            clock += 5.0;
            let sync_end = compute_free.max(clock) + 2.0;
            event(
                &mut out,
                format!(
                    "{{\"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"cudaDeviceSynchronize\", \"pid\": {host}, \"tid\": {host}, \
                     \"ts\": {clock:.3}, \"dur\": {:.3}, \"args\": {{\"cbid\": 165, \"correlation\": {}}}}}",
                    sync_end - clock,
                    correlation + 1
                ),
            )?;
            correlation += 1;
            clock = sync_end + 20.0;
            event(
                &mut out,
                format!(
                    "{{\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"ProfilerStep#{step}\", \"pid\": {host}, \"tid\": {host}, \
                     \"ts\": {step_start:.3}, \"dur\": {:.3}, \"args\": {{\"External id\": {}}}}}",
                    clock - step_start,
                    external + 2
                ),
            )?;
            external += 2;
            for text in pending {
                event(&mut out, text)?;
            }
        }
        out.write_all(b"\n]}\n")?;
        out.flush()
    }
}

/// One `cuda_runtime` event of the host thread `host`: the API call `name` (callback id `cbid`)
/// at `ts` µs lasting `dur` µs, linked to its kernel by `correlation` and, for launches made
/// by an operator, to that operator by `external`.
fn runtime_call(
    host: u64,
    name: &str,
    cbid: u32,
    ts: f64,
    dur: u32,
    correlation: u64,
    external: Option<u64>,
) -> String {
    let external = external.map(|id| format!(", \"External id\": {id}")).unwrap_or_default();
    format!(
        "{{\"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"{name}\", \"pid\": {host}, \"tid\": {host}, \
         \"ts\": {ts:.3}, \"dur\": {dur}, \"args\": {{\"cbid\": {cbid}, \"correlation\": {correlation}{external}}}}}"
    )
}

/// Counts what passes through.
struct CountingWriter<W: Write> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.bytes += written as u64;
        Ok(written)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
