//! The solver against a plain weighted water-filling: plain flows and group flows (a weight per
//! link) on random links get the max-min fair levels an independent, naive progressive filling
//! computes, after they join and again after some leave (the threshold's partial re-fills).

use proptest::prelude::*;
use topology::{LinkId, Route};
use units::SimTime;

use super::maxmin::{MaxMin, SpreadLink};

/// A flow of the reference: its claim (weight) on each link it crosses.
#[derive(Debug, Clone)]
struct Claims(Vec<(usize, f64)>);

/// Naive progressive filling: every unfrozen flow's level rises together; a link is full when
/// its claims at those levels reach its capacity, and every flow on it freezes. Returns each
/// flow's level (its rate per unit of weight).
fn water_fill(capacity: &[f64], flows: &[Claims]) -> Vec<f64> {
    let mut level = vec![0.0; flows.len()];
    let mut frozen = vec![false; flows.len()];
    let mut left = capacity.to_vec();
    while frozen.iter().any(|&f| !f) {
        // The largest common rise before some link fills.
        let mut rise = f64::INFINITY;
        for (l, &room) in left.iter().enumerate() {
            let weight: f64 = flows
                .iter()
                .enumerate()
                .filter(|&(f, _)| !frozen[f])
                .flat_map(|(_, claims)| claims.0.iter().filter(|&&(link, _)| link == l).map(|&(_, w)| w))
                .sum();
            if weight > 0.0 {
                rise = rise.min(room / weight);
            }
        }
        for (f, claims) in flows.iter().enumerate() {
            if !frozen[f] {
                level[f] += rise;
                for &(l, w) in &claims.0 {
                    left[l] -= rise * w;
                }
            }
        }
        // Freeze the flows on every link now full.
        let full: Vec<bool> = left.iter().zip(capacity).map(|(&room, &c)| room <= c * 1e-12).collect();
        for (f, claims) in flows.iter().enumerate() {
            if !frozen[f] && claims.0.iter().any(|&(l, _)| full[l]) {
                frozen[f] = true;
            }
        }
    }
    level
}

/// A random case: link capacities, plain routes (distinct links) and group spreads (distinct
/// links with weights).
type Case = (Vec<f64>, Vec<Vec<usize>>, Vec<Vec<(usize, f64)>>);

/// Draws a [`Case`].
fn case() -> impl Strategy<Value = Case> {
    (2usize..7).prop_flat_map(|links| {
        let capacity = prop::collection::vec(1.0f64..100.0, links);
        let route = prop::sample::subsequence((0..links).collect::<Vec<_>>(), 1..=links.min(4));
        let spread = prop::sample::subsequence((0..links).collect::<Vec<_>>(), 1..=links)
            .prop_flat_map(|links| {
                let n = links.len();
                (Just(links), prop::collection::vec(0.25f64..6.0, n))
            })
            .prop_map(|(links, weights)| links.into_iter().zip(weights).collect::<Vec<_>>());
        (capacity, prop::collection::vec(route, 0..6), prop::collection::vec(spread, 1..4))
    })
}

fn spread_of(claims: &[(usize, f64)]) -> Vec<SpreadLink> {
    claims
        .iter()
        .map(|&(link, weight)| SpreadLink {
            link: LinkId(link as u32),
            weight,
            bytes: weight,
            edges: 1,
            weighted: weight != 1.0,
        })
        .collect()
}

/// Every flow's level in `solver` (rate per unit of weight) against the reference over the
/// flows still on their links.
fn assert_levels(solver: &MaxMin<u32>, capacity: &[f64], flows: &[(u32, Claims)]) {
    let claims: Vec<Claims> = flows.iter().map(|(_, claims)| claims.clone()).collect();
    let expected = water_fill(capacity, &claims);
    for ((id, _), want) in flows.iter().zip(expected) {
        let got = solver.flow(*id).rate;
        assert!((got - want).abs() <= 1e-9 * want.max(1.0), "flow {id}: level {got}, expected {want}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn group_flows_share_links_by_their_weight_as_a_naive_water_filling_does(
        (capacity, routes, spreads) in case(),
        leaving in prop::collection::vec(any::<bool>(), 9),
    ) {
        let mut solver: MaxMin<u32> = MaxMin::new(capacity.clone());
        let now = SimTime::ZERO;
        let mut flows: Vec<(u32, Claims)> = Vec::new();
        let mut seeds = Vec::new();
        for (g, claims) in spreads.iter().enumerate() {
            let id = solver.add_group(now, g as u32, &spread_of(claims), 1e9, 1, 0);
            solver.join_group(id, now, &mut seeds);
            flows.push((id, Claims(claims.clone())));
        }
        for route in &routes {
            let links: Vec<LinkId> = route.iter().map(|&l| LinkId(l as u32)).collect();
            let id = solver.add(now, &Route::try_from(&links[..]).unwrap(), 1e9, 0);
            solver.join(id, now);
            seeds.extend(links);
            flows.push((id, Claims(route.iter().map(|&l| (l, 1.0)).collect())));
        }
        solver.collect(&seeds);
        solver.solve();
        solver.update(now, |_, _, _, _| Ok::<(), ()>(())).unwrap();
        assert_levels(&solver, &capacity, &flows);
        prop_assert!(solver.violation().is_none(), "{:?}", solver.violation());

        // Some leave: the rest re-fill from the links they left (a partial re-fill where
        // thresholds allow), and still match the reference over what stays.
        let mut seeds = Vec::new();
        let mut staying = Vec::new();
        for (index, (id, claims)) in flows.into_iter().enumerate() {
            if leaving.get(index).copied().unwrap_or(false) {
                if solver.flow(id).group == super::maxmin::NO_GROUP {
                    seeds.extend(solver.flow(id).route.iter().copied());
                    solver.leave(id);
                    solver.free(id);
                } else {
                    solver.leave_group(id, &mut seeds);
                }
            } else {
                staying.push((id, claims));
            }
        }
        if !seeds.is_empty() {
            solver.collect(&seeds);
            solver.solve();
            solver.update(now, |_, _, _, _| Ok::<(), ()>(())).unwrap();
        }
        assert_levels(&solver, &capacity, &staying);
    }
}

/// One step of [`shortcuts_give_the_rates_of_the_whole_filling`]: flows join (plain routes and
/// group spreads over links drawn from `links`), some of those on their links leave (drawn by
/// index), or a link's capacity changes; then one re-fill.
#[derive(Debug, Clone)]
enum Step {
    Join { routes: Vec<Vec<usize>>, spreads: Vec<Vec<(usize, f64)>> },
    Leave(Vec<usize>),
    Capacity(usize, f64),
}

/// Draws a sequence of [`Step`]s over `links` links. Half the plain routes cross link 0 and
/// half the spreads avoid it: with link 0 slow, flows held back there are kept beside group
/// flows that join faster links.
fn steps(links: usize) -> impl Strategy<Value = Vec<Step>> {
    let all: Vec<usize> = (0..links).collect();
    let route = (prop::sample::subsequence(all.clone(), 1..=links.min(3)), any::<bool>()).prop_map(
        |(mut route, slow)| {
            if slow && route[0] != 0 {
                route.insert(0, 0);
                route.truncate(3);
            }
            route
        },
    );
    let fast: Vec<usize> = (1..links).collect();
    let spread = prop_oneof![
        prop::sample::subsequence(all, 1..=links.min(5)),
        prop::sample::subsequence(fast, 1..=(links - 1).min(5)),
    ]
    .prop_flat_map(|links| {
        let n = links.len();
        // Edge counts (unweighted) mostly, a byte weighting (weighted) sometimes.
        let weight = prop_oneof![4 => (1u32..4).prop_map(f64::from), 1 => 0.25f64..6.0];
        (Just(links), prop::collection::vec(weight, n))
    })
    .prop_map(|(links, weights)| links.into_iter().zip(weights).collect::<Vec<_>>());
    let join = (prop::collection::vec(route, 0..3), prop::collection::vec(spread, 0..4))
        .prop_map(|(routes, spreads)| Step::Join { routes, spreads });
    let leave = prop::collection::vec(0usize..64, 1..4).prop_map(Step::Leave);
    let capacity = (0..links, prop_oneof![Just(0.0), 1.0f64..100.0]).prop_map(|(l, c)| Step::Capacity(l, c));
    prop::collection::vec(prop_oneof![3 => join, 2 => leave, 1 => capacity], 1..12)
}

/// Runs `steps` on a solver over `capacity`, with or without the shortcuts: per re-fill, the
/// flows whose rate changed, in order, with their new rate's bits.
fn run_steps(capacity: &[f64], steps: &[Step], shortcuts: bool) -> Vec<Vec<(u32, u64)>> {
    let mut solver: MaxMin<u32> = MaxMin::new(capacity.to_vec());
    solver.filling_every_flow = !shortcuts;
    let now = SimTime::ZERO;
    let mut on: Vec<u32> = Vec::new();
    let mut refills = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        let mut seeds = Vec::new();
        match step {
            Step::Join { routes, spreads } => {
                for spread in spreads {
                    // A whole weight is an edge count: unweighted.
                    let mut spread = spread_of(spread);
                    for entry in &mut spread {
                        entry.weighted = entry.weight.fract() != 0.0;
                    }
                    let id = solver.add_group(now, index as u32, &spread, 1e9, 1, 0);
                    solver.join_group(id, now, &mut seeds);
                    on.push(id);
                }
                for route in routes {
                    let links: Vec<LinkId> = route.iter().map(|&l| LinkId(l as u32)).collect();
                    let id = solver.add(now, &Route::try_from(&links[..]).unwrap(), 1e9, 0);
                    if let super::maxmin::Joined::Shared = solver.join(id, now) {
                        seeds.extend(links);
                    }
                    on.push(id);
                }
            }
            Step::Leave(picks) => {
                for &pick in picks {
                    if on.is_empty() {
                        break;
                    }
                    let id = on.remove(pick % on.len());
                    if solver.flow(id).group == super::maxmin::NO_GROUP {
                        let route = solver.flow(id).route;
                        if solver.leave(id) {
                            seeds.extend(route.iter().copied());
                        }
                        solver.free(id);
                    } else {
                        solver.leave_group(id, &mut seeds);
                    }
                }
            }
            Step::Capacity(link, capacity) => {
                solver.set_capacity(LinkId(*link as u32), *capacity);
                if solver.is_busy(LinkId(*link as u32)) {
                    seeds.push(LinkId(*link as u32));
                }
            }
        }
        let mut changed = Vec::new();
        if !seeds.is_empty() {
            solver.collect(&seeds);
            solver.solve();
            solver
                .update(now, |id, flow, _, _| {
                    changed.push((id, flow.rate.to_bits()));
                    Ok::<(), ()>(())
                })
                .unwrap();
            prop_assert_no_violation(&solver);
        }
        refills.push(changed);
    }
    refills
}

/// The solver's allocation on the last component meets max-min fairness's conditions.
fn prop_assert_no_violation(solver: &MaxMin<u32>) {
    assert!(solver.violation().is_none(), "{:?}", solver.violation());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// The re-fill's shortcuts (a group flow alone on its links settled at its rate alone
    /// without visiting them, and a flow that shares no link with another collected flow
    /// settled before the pops) change nothing: every re-fill gives the same flows the same
    /// rates, bit for bit, in the same order, as filling every collected flow, over joins,
    /// leaves and capacity changes (links down included).
    #[test]
    fn shortcuts_give_the_rates_of_the_whole_filling(
        (capacity, steps) in (2usize..12).prop_flat_map(|links| {
            // Fast links beside slow ones: flows held back elsewhere are kept on the fast ones.
            let capacity = prop_oneof![Just(10.0), 1.0f64..100.0, 1_000.0f64..10_000.0];
            let capacity = (0.5f64..5.0, prop::collection::vec(capacity, links - 1))
                .prop_map(|(slow, fast)| std::iter::once(slow).chain(fast).collect::<Vec<_>>());
            (capacity, steps(links))
        }),
    ) {
        let with = run_steps(&capacity, &steps, true);
        let without = run_steps(&capacity, &steps, false);
        prop_assert_eq!(with, without);
    }
}
