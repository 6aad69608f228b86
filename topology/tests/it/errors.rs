//! Impossible specs are errors that name the parameter and say what is valid.

use topology::{
    CascadeSpec, ClusterSpec, DragonflySpec, FabricSpec, IntraNode, NetworkSpec, Routing, Topology,
    TopologyError, XgftSpec,
};

use crate::link;

fn build(nodes: u32, fabric: FabricSpec, routing: Routing) -> Result<Topology, TopologyError> {
    Topology::build(&ClusterSpec {
        nodes,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link("300 GB/s", "1 us")),
        network: NetworkSpec { routing, ..NetworkSpec::new(fabric) },
        host_memory: None,
    })
}

fn message(nodes: u32, fabric: FabricSpec) -> String {
    build(nodes, fabric, Routing::Auto).unwrap_err().to_string()
}

fn assert_mentions(text: &str, words: &[&str]) {
    for word in words {
        assert!(text.contains(word), "{text:?} does not mention {word:?}");
    }
}

#[test]
fn bad_fat_trees_name_the_list_at_fault() {
    let l = link("100 Gb/s", "1 us");
    let tree = |levels, down: Vec<u32>, up: Vec<u32>, count: Vec<u32>| {
        let links = vec![l; levels as usize];
        FabricSpec::FatTree(XgftSpec { levels, down, up, count, links, oversubscription: Vec::new() })
    };
    assert_mentions(
        &message(4, tree(3, vec![2, 2], vec![1, 2, 2], vec![1, 1, 1])),
        &["fat-tree down", "levels is 3"],
    );
    assert_mentions(
        &message(4, tree(2, vec![2, 2], vec![1, 0], vec![1, 1])),
        &["fat-tree up", "entry 1 is 0"],
    );
    assert_mentions(&message(4, tree(2, vec![2, 2], vec![1, 2], vec![1])), &["fat-tree count"]);
    assert_eq!(
        build(4, tree(0, vec![], vec![], vec![]), Routing::Auto).unwrap_err(),
        TopologyError::Zero { what: "fat-tree levels" }
    );
    let mut oversubscribed = XgftSpec::k_ary(4, 3, vec![l; 3]).unwrap();
    oversubscribed.oversubscription = vec![1.0, 0.5, 1.0];
    assert_mentions(&message(16, FabricSpec::FatTree(oversubscribed)), &["oversubscription", "at least 1"]);
    assert_mentions(&XgftSpec::k_ary(5, 3, vec![l; 3]).unwrap_err().to_string(), &["fat-tree k", "even"]);
    assert_mentions(&XgftSpec::leaf_spine(7, vec![l; 2]).unwrap_err().to_string(), &["leaf-spine radix"]);
    assert_mentions(
        &XgftSpec::from_simgrid("3;2,2;1", l).unwrap_err().to_string(),
        &["LEVELS;DOWN;UP;COUNT"],
    );
    // 17 servers do not fit on 16 leaves.
    let k4 = FabricSpec::FatTree(XgftSpec::k_ary(4, 3, vec![l; 3]).unwrap());
    assert_eq!(
        build(17, k4, Routing::Auto).unwrap_err(),
        TopologyError::TooFewTerminals {
            fabric: "fat-tree 3;2,2,4;1,2,2;1,1,1".into(),
            capacity: 16,
            needed: 17
        }
    );
}

#[test]
fn bad_dragonflies_name_the_parameter() {
    let l = link("100 Gb/s", "1 us");
    let spec = DragonflySpec {
        groups: 10,
        routers_per_group: 2,
        hosts_per_router: 1,
        global_links_per_router: 2,
        terminal: l,
        local: l,
        global: l,
    };
    assert_mentions(
        &message(4, FabricSpec::Dragonfly(spec.clone())),
        &["dragonfly groups", "at most 5 groups"],
    );
    let zero = DragonflySpec { routers_per_group: 0, ..spec };
    assert_eq!(
        build(4, FabricSpec::Dragonfly(zero), Routing::Auto).unwrap_err(),
        TopologyError::Zero { what: "dragonfly routers-per-group" }
    );
    // SimGrid's Cascade variant needs #groups <= routers per chassis, as collsim checks.
    let too_many = CascadeSpec::from_simgrid("5,1;1,1;4,1;1", l).unwrap();
    assert_mentions(
        &message(4, FabricSpec::CascadeDragonfly(too_many)),
        &["cascade-dragonfly groups", "at most routers-per-chassis"],
    );
    let zero = CascadeSpec::from_simgrid("2,0;1,1;2,1;1", l).unwrap();
    assert_eq!(
        build(2, FabricSpec::CascadeDragonfly(zero), Routing::Auto).unwrap_err(),
        TopologyError::Zero { what: "cascade-dragonfly global-links" }
    );
    assert_mentions(
        &CascadeSpec::from_simgrid("4,1;2;4,1;4", l).unwrap_err().to_string(),
        &["G,GL;C,CL;R,RL;NODES"],
    );
}

#[test]
fn bad_tori_and_oversized_fabrics_are_errors() {
    let l = link("100 Gb/s", "1 us");
    assert_mentions(&message(2, FabricSpec::Torus { dims: vec![], link: l }), &["dims", "is empty"]);
    assert_mentions(
        &message(2, FabricSpec::Torus { dims: vec![4, 0], link: l }),
        &["dims", "dimension 1 is 0"],
    );
    assert_mentions(
        &message(20, FabricSpec::Torus { dims: vec![4, 4], link: l }),
        &["room for 16 terminals", "needs 20"],
    );
    assert!(matches!(
        build(20_000, FabricSpec::FullyConnected { link: l }, Routing::Auto),
        Err(TopologyError::TooLarge { .. })
    ));
}

#[test]
fn a_routing_the_fabric_cannot_do_is_an_error_listing_the_valid_ones() {
    let l = link("100 Gb/s", "1 us");
    let k4 = FabricSpec::FatTree(XgftSpec::k_ary(4, 3, vec![l; 3]).unwrap());
    let error = build(16, k4, Routing::Valiant).unwrap_err();
    assert_eq!(
        error.to_string(),
        "routing \"valiant\" does not apply to a fat-tree; valid: \"dmodk\" (the default), \"ecmp\", or \"auto\""
    );
    let dragonfly = FabricSpec::Dragonfly(DragonflySpec::balanced(1, l, l, l));
    assert_mentions(
        &build(6, dragonfly, Routing::DModK).unwrap_err().to_string(),
        &["\"dmodk\"", "dragonfly", "\"minimal\"", "\"ugal\""],
    );
    assert_mentions(
        &build(4, FabricSpec::Ring { link: l }, Routing::Ecmp).unwrap_err().to_string(),
        &["ring", "\"shortest\""],
    );
    assert!(build(4, FabricSpec::Switch { link: l }, Routing::Ecmp).is_err());
}
