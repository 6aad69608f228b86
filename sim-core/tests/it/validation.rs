//! Malformed graphs are errors that name the op, never a hang or a panic.

use sim_core::graph::{
    Collective, CollectiveAlgorithm, CollectiveKind, GraphBuilder, GraphError, OpId, RankId, StreamId,
};
use sim_core::units::{Bytes, SimDuration};

fn us(n: u64) -> SimDuration {
    SimDuration::from_us(n)
}

#[test]
fn a_dependency_cycle_is_reported_with_its_ops() {
    let mut graph = GraphBuilder::new(1);
    graph.compute(RankId(0), StreamId(0), us(1), "a", &[OpId(2)]);
    graph.compute(RankId(0), StreamId(1), us(1), "b", &[OpId(0)]);
    graph.compute(RankId(0), StreamId(2), us(1), "c", &[OpId(1)]);
    let error = graph.build().unwrap_err();
    let GraphError::Cycle { cycle } = &error else { panic!("expected a cycle, got {error}") };
    for label in ["\"a\"", "\"b\"", "\"c\""] {
        assert!(cycle.contains(label), "{error}");
    }
}

#[test]
fn a_dependency_on_a_later_op_of_the_same_stream_is_a_cycle() {
    let mut graph = GraphBuilder::new(1);
    graph.compute(RankId(0), StreamId(0), us(1), "first", &[OpId(1)]);
    graph.compute(RankId(0), StreamId(0), us(1), "second", &[]);
    assert!(matches!(graph.build(), Err(GraphError::Cycle { .. })));
}

#[test]
fn collectives_issued_in_opposite_orders_deadlock() {
    let mut graph = GraphBuilder::new(2);
    let group = graph.add_group(vec![RankId(0), RankId(1)]);
    let collective = |bytes| Collective {
        kind: CollectiveKind::AllReduce,
        group,
        bytes: Bytes(bytes),
        algorithm: CollectiveAlgorithm::Auto,
    };
    let first = graph.add_collective(collective(1));
    let second = graph.add_collective(collective(2));
    graph.collective(RankId(0), StreamId(0), first, "grad bucket 0", &[]);
    graph.collective(RankId(0), StreamId(0), second, "grad bucket 1", &[]);
    graph.collective(RankId(1), StreamId(0), second, "grad bucket 1", &[]);
    graph.collective(RankId(1), StreamId(0), first, "grad bucket 0", &[]);
    let error = graph.build().unwrap_err().to_string();
    assert!(error.contains("deadlock") && error.contains("grad bucket"), "{error}");
}

#[test]
fn missing_ops_ranks_and_members_are_named() {
    let mut graph = GraphBuilder::new(2);
    graph.compute(RankId(0), StreamId(0), us(1), "fwd", &[OpId(7)]);
    let error = graph.build().unwrap_err().to_string();
    assert!(error.contains("op 0") && error.contains("\"fwd\"") && error.contains("op 7"), "{error}");

    let mut graph = GraphBuilder::new(2);
    graph.compute(RankId(2), StreamId(0), us(1), "fwd", &[]);
    let error = graph.build().unwrap_err().to_string();
    assert!(error.contains("rank 2") && error.contains("only 2 ranks"), "{error}");

    let mut graph = GraphBuilder::new(2);
    graph.transfer(RankId(1), StreamId(0), RankId(1), Bytes(1), "loop", &[]);
    assert!(matches!(graph.build(), Err(GraphError::SelfTransfer { .. })));

    let mut graph = GraphBuilder::new(3);
    let group = graph.add_group(vec![RankId(0), RankId(1), RankId(2)]);
    let c = graph.add_collective(Collective {
        kind: CollectiveKind::AllGather,
        group,
        bytes: Bytes(1),
        algorithm: CollectiveAlgorithm::Auto,
    });
    graph.collective(RankId(0), StreamId(0), c, "gather", &[]);
    graph.collective(RankId(1), StreamId(0), c, "gather", &[]);
    let error = graph.build().unwrap_err().to_string();
    assert!(error.contains("rank 2 is in the group but has no op"), "{error}");
}

#[test]
fn malformed_groups_and_algorithms_are_refused() {
    let mut graph = GraphBuilder::new(2);
    graph.add_group(vec![RankId(0), RankId(0)]);
    assert!(graph.build().unwrap_err().to_string().contains("twice"));

    let mut graph = GraphBuilder::new(2);
    let group = graph.add_group(vec![RankId(0), RankId(1)]);
    graph.add_collective(Collective {
        kind: CollectiveKind::AllReduce,
        group,
        bytes: Bytes(1),
        algorithm: CollectiveAlgorithm::Pairwise,
    });
    assert!(graph.build().unwrap_err().to_string().contains("cannot perform allreduce"));

    let mut graph = GraphBuilder::new(2);
    let group = graph.add_group(vec![RankId(0), RankId(1)]);
    graph.add_collective(Collective {
        kind: CollectiveKind::Broadcast { root: 2 },
        group,
        bytes: Bytes(1),
        algorithm: CollectiveAlgorithm::Auto,
    });
    assert!(graph.build().unwrap_err().to_string().contains("root position 2"));
}

/// Checking a collective's members looked each member op's rank up in the group by a scan,
/// quadratic in ranks: 3.4 s of a 131,072-rank collective's 5.1 s (release build, perf), so
/// some 200 s at 1 M ranks. A 1,048,576-rank collective now validates in a fraction of a second.
#[test]
fn a_collective_over_many_ranks_validates_in_linear_time() {
    let ranks = 1 << 20;
    let mut graph = GraphBuilder::new(ranks);
    let everyone = graph.add_group((0..ranks).map(RankId).collect());
    let collective = graph.add_collective(Collective {
        kind: CollectiveKind::AllReduce,
        group: everyone,
        bytes: Bytes(1 << 20),
        algorithm: CollectiveAlgorithm::Ring,
    });
    for rank in 0..ranks {
        graph.collective(RankId(rank), StreamId(0), collective, "allreduce", &[]);
    }
    let started = std::time::Instant::now();
    graph.build().unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "took {:?}", started.elapsed());
}
