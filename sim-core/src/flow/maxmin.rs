//! Max-min fair sharing of link capacities among flows, by progressive filling.
//!
//! A flow is a route of links and a number of bytes. Once it has joined its links it shares
//! every one of them with the other flows there: the rates are the max-min fair allocation,
//! found by progressive filling (raise every unfrozen flow's rate together; when a link
//! fills, freeze the flows crossing it at that rate). A change (a flow joining or leaving)
//! alters only the rates of the flows connected to its links through shared links, its
//! connected component: [`MaxMin::collect`] finds the component from the links that changed,
//! [`MaxMin::solve`] fills it, and [`MaxMin::update`] brings each flow whose rate changed up
//! to date and reports when it will be done at its new rate.
//!
//! A group flow ([`MaxMin::add_group`]) stands for many flows that advance together (a
//! steady-state collective's edges): it is one flow whose links each carry it with a weight
//! (the summed weights of the edges it stands for that cross the link), so it claims that many
//! flows' shares there, and its rate is per unit of weight. An all-to-all of 64 ranks is one
//! flow on a few hundred links instead of 4,032 flows on five links each: joining, leaving
//! and re-filling cost its links, not its edges. The solver knows nothing of what a flow or a
//! group carries: its owner is an opaque `T`, handed back untouched.
//!
//! Invariants:
//! - a flow is on exactly the links of its route from [`MaxMin::join`] (or
//!   [`MaxMin::join_group`]) until [`MaxMin::leave`] (or [`MaxMin::leave_group`]), and on
//!   none otherwise; `remaining` is the bytes left as of `updated`, at `rate`;
//! - after a re-fill, no link carries more than its capacity, and every flow outside a group
//!   has a bottleneck: a full link on which no flow is faster ([`MaxMin::violation`] checks
//!   both);
//! - a group flow is listed (with its weight) on exactly the links of its spread from
//!   [`MaxMin::join_group`] until [`MaxMin::leave_group`], and on none otherwise;
//! - a flow's `generation` changes whenever its rate does and whenever its slot is reused, so
//!   a completion computed at an older rate (or for the slot's previous flow) never matches;
//! - the filling visits the component only: its work is one visit per flow and per link of
//!   the component (what [`MaxMin::collect`] returns), whatever the size of the network;
//! - a group flow's `Solo::shared` counts the links of its spread that carry another flow too
//!   (plain or group), and its `Solo::alone`, once found, is the rate it takes alone on its
//!   spread at the capacities now (forgotten when one changes): a group flow with no shared
//!   link is alone, and its re-fill costs no visit of its links (see [`MaxMin::collect`]);
//! - a link's `modified` stamp grows with every join, leave and capacity change there, so a
//!   [`Summary`] of a group flow's join or leave holds exactly while its links' stamps are
//!   not later than its own.

use std::collections::BinaryHeap;

use topology::{LinkId, Route};
use units::{SimDuration, SimTime};

use super::link_lists::LinkLists;
use super::link_order::{KeySort, next_link, order_key, share_and_link, sort_largest};

/// `Flow::group` of a flow in no group.
pub(super) const NO_GROUP: u32 = u32::MAX;

/// The smallest weight an edge of a group claims (see [`SpreadLink::weight`]): an edge a
/// million times lighter than the heaviest still holds a share, so no division by zero.
pub(super) const MIN_WEIGHT: f64 = 1e-9;

/// One flow: its route, what it has left to deliver, and at what rate.
#[derive(Debug, Clone)]
pub(super) struct Flow<T> {
    /// The links it crosses.
    pub(super) route: Route,
    /// Size in bytes.
    pub(super) size: f64,
    /// Bytes still to deliver as of `updated`.
    pub(super) remaining: f64,
    /// Current rate in bytes per second (0 until it joins its links); per unit of weight for a
    /// group flow, so that it is also the filling level at which it froze, which a re-fill
    /// compares with its threshold (see [`MaxMin::collect`]).
    pub(super) rate: f64,
    /// When `remaining` was last brought up to date.
    pub(super) updated: SimTime,
    /// Changes with every rate change and every reuse of the slot.
    pub(super) generation: u32,
    /// Who is waiting for it (never read here).
    pub(super) owner: T,
    /// For a group flow ([`MaxMin::add_group`]), its owner's group id; [`NO_GROUP`] for a
    /// plain flow. A group flow's `rate` is per unit of weight, its `size` and `remaining` in
    /// bytes per unit of weight.
    pub(super) group: u32,
    /// Frozen at rate 0 by a re-fill (a link of its route is down), as opposed to a flow that
    /// has just joined and has no rate yet: a re-fill may keep it at 0 below its threshold.
    pub(super) stalled: bool,
}

/// One link of a group flow's spread: the link, the weight it claims there, and what it
/// stands for on it (kept for the caller's accounting, never read by the filling).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct SpreadLink {
    /// The link.
    pub(super) link: LinkId,
    /// The summed weights of the edges crossing it: the group claims that many flows' shares
    /// here, and carries its rate times this.
    pub(super) weight: f64,
    /// The bytes of the edges crossing it.
    pub(super) bytes: f64,
    /// How many edges cross it.
    pub(super) edges: u32,
    /// Whether an edge of weight other than 1 crosses it: such a link's weight is not a flow
    /// count, so a re-fill touching it covers the whole component (see [`MaxMin::collect`]).
    pub(super) weighted: bool,
}

/// What happened when a flow joined its links ([`MaxMin::join`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Joined {
    /// Nothing to share: the flow has no bytes left or its route no link; it is on no link.
    Empty,
    /// Alone on every link of its route: it runs at its slowest link's capacity and is done
    /// after `delay` at that rate (its `generation` now); no other rate changed.
    Alone {
        /// Until its last byte is delivered; `None` while a link of its route is down (rate 0:
        /// it stalls until a re-fill gives it a rate).
        delay: Option<SimDuration>,
        /// Its generation at this rate.
        generation: u32,
    },
    /// It shares a link: the component of its route needs a re-fill.
    Shared,
}

/// When `remaining` bytes at `rate` bytes per second are delivered (rounded up to the
/// picosecond); `None` at rate 0 (a flow stalled on a link that is down).
#[inline]
fn due_in(remaining: f64, rate: f64) -> Option<SimDuration> {
    (rate > 0.0).then(|| SimDuration::from_ps(ceil_to_u64(remaining / rate * 1e12)))
}

/// `x.ceil() as u64`, without the call to libm's `ceil` that a target without SSE4.1's
/// `roundsd` makes of it (one per flow that gets a rate): the truncation, plus one if it
/// is below `x`. The same for every `x`: past 2^53 every float is an integer, so the
/// truncation is `x` itself; negative, NaN and too large values saturate as the cast does.
/// Below 2^63 the conversions are through `i64`, which the processor converts in one
/// instruction each way (`u64` takes a sequence of them).
#[inline]
fn ceil_to_u64(x: f64) -> u64 {
    if (0.0..9_223_372_036_854_775_808.0).contains(&x) {
        let truncated = x as i64;
        return if (truncated as f64) < x { truncated as u64 + 1 } else { truncated as u64 };
    }
    let truncated = x as u64;
    if (truncated as f64) < x { truncated.saturating_add(1) } else { truncated }
}

/// The marks and lists [`MaxMin::collect`] grows, borrowed for one link's flows.
struct Marks<'a> {
    epoch: u64,
    threshold: f64,
    /// Settle alone group flows at their rate alone instead of queueing their links (see
    /// [`MaxMin::collect`]).
    shortcuts: bool,
    flow_epoch: &'a mut [u64],
    link_fill: &'a mut [LinkFill],
    component_flows: &'a mut Vec<u32>,
    component_links: &'a mut Vec<u32>,
    solo: &'a mut [Solo],
    capacity: &'a [f64],
    new_rate: &'a mut [f64],
    /// Alone group flows collected, their rates already found.
    settled: &'a mut usize,
}

impl Marks<'_> {
    /// Collects `flow` (and queues its links not yet seen) unless it is kept at its rate,
    /// which it then returns: frozen below the threshold (a flow that just joined has no rate
    /// yet and is always re-filled; one stalled at 0 on a link that is down froze at level 0,
    /// and is kept unless a capacity changed: threshold 0). A flow collected before counts as
    /// collected. A group flow alone on its links is collected frozen at its rate alone
    /// (marked `epoch + 1`), its links not queued: they carry nothing else.
    #[inline(always)]
    fn visit<T>(&mut self, flow: u32, flows: &[Flow<T>], spreads: &[Vec<SpreadLink>]) -> Option<f64> {
        let f = flow as usize;
        // Collected (`epoch`) or settled (`epoch + 1`) in this collection already.
        if self.flow_epoch[f] >= self.epoch {
            return None;
        }
        let candidate = &flows[f];
        if candidate.rate < self.threshold && (candidate.rate != 0.0 || candidate.stalled) {
            return Some(candidate.rate);
        }
        self.component_flows.push(flow);
        if self.shortcuts
            && candidate.group != NO_GROUP
            && let Some(solo) = self.solo.get_mut(f)
            && solo.shared == 0
        {
            self.flow_epoch[f] = self.epoch + 1;
            self.new_rate[f] = solo.alone(&spreads[f], self.capacity).0;
            *self.settled += 1;
            return None;
        }
        self.flow_epoch[f] = self.epoch;
        // Its route, then its spread (none for a plain flow, and none at all before the first
        // group flow).
        for &other in candidate.route.iter() {
            self.reach(other.0);
        }
        if let Some(spread) = spreads.get(f) {
            for entry in spread {
                self.reach(entry.link.0);
            }
        }
        None
    }

    /// Queues `link` unless it is in the component already.
    #[inline(always)]
    fn reach(&mut self, link: u32) {
        let state = &mut self.link_fill[link as usize];
        if state.epoch != self.epoch {
            state.epoch = self.epoch;
            self.component_links.push(link);
        }
    }
}

/// A link's state in a re-fill, in one place: a re-fill visits a link's mark, what is left of
/// it, its unfrozen count and weight together, one cache line instead of one per array.
#[derive(Debug, Clone, Copy, Default)]
struct LinkFill {
    /// What is left of the capacity: after the flows kept at their rates and those frozen so
    /// far.
    remaining: f64,
    /// The weight of its flows not yet frozen.
    unfrozen_weight: f64,
    /// [`MaxMin::epoch`] when it was last collected.
    epoch: u64,
    /// How many of its flows are not yet frozen.
    unfrozen: u32,
    /// The first flow [`MaxMin::collect`] counted on it: its only one when it counted one.
    first: u32,
}

impl LinkFill {
    /// A flow frozen at `share` per unit of weight, of weight `weight` here, takes its part of
    /// what the link has left and leaves its count and weight.
    #[inline(always)]
    fn take(&mut self, share: f64, weight: f64) {
        self.remaining = (self.remaining - share * weight).max(0.0);
        self.unfrozen -= 1;
        self.unfrozen_weight = (self.unfrozen_weight - weight).max(MIN_WEIGHT);
    }
}

/// The group flows on link `l` with their weights there, from `groups_on_link` (see
/// [`MaxMin`]'s field): none before the first group flow joins.
#[inline(always)]
fn groups_of(groups_on_link: &[Vec<(u32, f64)>], l: usize) -> &[(u32, f64)] {
    groups_on_link.get(l).map_or(&[], Vec::as_slice)
}

/// What a group flow's re-fill needs to know of its links without visiting them (see
/// [`MaxMin::collect`]).
#[derive(Debug, Clone, Copy, Default)]
struct Solo {
    /// The links of its spread that carry another flow too (plain or group): 0 when it is
    /// alone on every one.
    shared: u32,
    /// Once asked for (see [`Solo::alone`]) and until a capacity of its spread changes: the
    /// rate it takes alone, and whether a link of its spread is weighted.
    alone: Option<(f64, bool)>,
}

impl Solo {
    /// The rate the group flow of `spread` takes alone at `capacity` (see [`alone_rate`]),
    /// and whether a link of it is weighted: found once, then kept.
    #[inline]
    fn alone(&mut self, spread: &[SpreadLink], capacity: &[f64]) -> (f64, bool) {
        *self.alone.get_or_insert_with(|| alone_rate(spread, capacity))
    }
}

/// The rate group flow `spread` takes alone at `capacity`, and whether a link of it is
/// weighted: the fair share (capacity over its weight) of the link of its spread a filling
/// would pop first (the largest [`order_key`]), the share at which it would freeze there.
/// Alone, each link's share is its capacity over the group's weight there, as a filling
/// computes it (the weight summed over one group is that weight), and the first link popped
/// is the one of the largest key: the group freezes at its share.
fn alone_rate(spread: &[SpreadLink], capacity: &[f64]) -> (f64, bool) {
    let (mut best, mut rate, mut weighted) = (None, f64::INFINITY, false);
    for entry in spread {
        let share = capacity[entry.link.0 as usize] / entry.weight;
        let key = Some(order_key(share, entry.link.0));
        if key > best {
            (best, rate) = (key, share);
        }
        weighted |= entry.weighted;
    }
    (rate, weighted)
}

/// A flow arrives on link `l` (not listed there yet): a group flow alone there so far now
/// shares it (see [`Solo::shared`]).
#[inline]
fn arrive(on_link: &LinkLists, groups_on_link: &[Vec<(u32, f64)>], solo: &mut [Solo], l: usize) {
    if let [(group, _)] = groups_of(groups_on_link, l)
        && on_link.is_empty(l)
    {
        solo[*group as usize].shared += 1;
    }
}

/// A flow has left link `l` (listed there no more): a group flow alone there now no longer
/// shares it.
#[inline]
fn depart(on_link: &LinkLists, groups_on_link: &[Vec<(u32, f64)>], solo: &mut [Solo], l: usize) {
    if let [(group, _)] = groups_of(groups_on_link, l)
        && on_link.is_empty(l)
    {
        solo[*group as usize].shared -= 1;
    }
}

/// A seed of [`MaxMin::collect`] that stands for a group flow's whole spread (see
/// [`MaxMin::join_group`]): the flow id with this bit set, where a link id would be (link ids
/// stay below it: [`LinkLists`] refuses 2^30 links).
const GROUP_SEED: u32 = 1 << 31;

/// The group flow a seed stands for, if it is a [`GROUP_SEED`].
#[inline(always)]
fn group_seed(seed: u32) -> Option<usize> {
    (seed & GROUP_SEED != 0).then_some((seed & !GROUP_SEED) as usize)
}

/// A seed of [`MaxMin::collect`] that stands for the links a group flow left (see
/// [`MaxMin::leave_group`]): the index of its [`Summary`] with this bit set.
const LEAVE_SEED: u32 = 1 << 30;

/// The summary a seed stands for, if it is a [`LEAVE_SEED`].
#[inline(always)]
fn leave_seed(seed: u32) -> Option<usize> {
    (seed & (GROUP_SEED | LEAVE_SEED) == LEAVE_SEED).then_some((seed & !LEAVE_SEED) as usize)
}

/// What a group flow's links held when it joined or left them, for [`MaxMin::collect`] to
/// use instead of visiting them while they are as they were (no flow joined or left them
/// since, no capacity changed: see [`MaxMin::stamp`]). If every other flow on them is kept
/// at its rate (all slower than the re-fill's threshold), their visit would collect nothing
/// but the group flow that joined, alone among the collected there: it freezes at the
/// largest-key share of what the kept flows leave of its links.
#[derive(Debug, Clone, Copy, Default)]
struct Summary {
    /// The stamp of the join or leave: the summary holds while its links' are no later.
    stamp: u64,
    /// The fastest rate of the other flows on its links (infinite if one has no rate yet,
    /// which is never kept); negative infinity if there is none.
    fastest: f64,
    /// What its links give the threshold, as seeds: the least capacity over weight on them,
    /// 0 if one is weighted (see [`MaxMin::collect`]).
    threshold: f64,
    /// A join: the rate the group flow takes if every other flow on its links is kept (NaN
    /// where the summary can never be used: its fastest other flow is not below the
    /// threshold its own links give).
    rate: f64,
    /// Whether the summary held when [`MaxMin::collect`] looked (its first pass).
    holds: bool,
    /// A leave: its links, in `summary_links`.
    start: u32,
    end: u32,
}

/// The summed weight of the flows on a link, from its `plain` flows (each weighs 1) and its
/// `groups` (each its weight there).
#[inline]
fn link_weight(plain: &[u32], groups: &[(u32, f64)]) -> f64 {
    let groups: f64 = groups.iter().map(|&(_, weight)| weight).sum();
    f64::from(plain.len() as u32) + groups
}

/// The max-min fair rates of the flows on a set of links (see the module documentation).
/// Flow slots are reused; `T` is each flow's owner.
#[derive(Debug)]
pub(super) struct MaxMin<T> {
    /// Link capacities in bytes per second, as they are now (a window may hold a link below
    /// its capacity as built, or at 0: down).
    capacity: Vec<f64>,
    /// Link capacities as built, what uncontended estimates use: empty while no capacity has
    /// changed (they are `capacity` then), a copy from the first [`MaxMin::set_capacity`] on.
    nominal: Vec<f64>,
    flows: Vec<Flow<T>>,
    free_flows: Vec<u32>,
    /// Flows sharing each link.
    on_link: LinkLists,
    /// Where each flow is in the list of each link of its route (`on_link[route[k]][slots[id][k]]
    /// == id` while it is on its links): a flow leaves a link in constant time, not by a search
    /// of a list that an all-to-all makes hundreds of flows long.
    slots: Vec<[u32; Route::CAPACITY]>,
    /// Flows on their links (a group flow counts its edges).
    active_flows: usize,
    /// Each group flow's spread, by flow id (empty for a plain flow; kept allocated for reuse).
    spreads: Vec<Vec<SpreadLink>>,
    /// Each group flow's edge count, by flow id (0 for a plain flow): what `active_flows`
    /// counts it as.
    edges: Vec<u32>,
    /// The group flows on each link, with the weight each claims there; empty (no list per
    /// link at all) until the first group flow joins (see [`groups_of`]).
    groups_on_link: Vec<Vec<(u32, f64)>>,
    /// Entries in all of `groups_on_link`: while there is none (message-by-message runs), a
    /// link's group list need not be looked at to know that it is empty.
    group_entries: usize,
    /// Group flows on each link whose weight there is not an edge count (see
    /// [`SpreadLink::weighted`]): where this is 0, a link's weight is a count of edges. Empty
    /// until the first group flow joins, as `groups_on_link`.
    weighted_on_link: Vec<u32>,
    /// Each group flow's sharing and rate alone, by flow id (see [`Solo`]; as long as
    /// `spreads`).
    solo: Vec<Solo>,
    // Scratch state of the max-min filling, reused across recomputations.
    epoch: u64,
    /// Each link's mark and filling state.
    link_fill: Vec<LinkFill>,
    flow_epoch: Vec<u64>,
    component_links: Vec<u32>,
    component_flows: Vec<u32>,
    new_rate: Vec<f64>,
    /// The component's links by their fair share at the start of a filling, the next to pop
    /// last, as [`order_key`]s (see [`MaxMin::fill`]).
    sorted: Vec<u128>,
    /// The links whose share had grown when popped from `sorted`, as [`order_key`]s of their
    /// share when pushed again: a lower bound of their current share, since shares only grow
    /// as flows freeze.
    heap: BinaryHeap<u128>,
    /// Scratch of the sort of `sorted`.
    key_sort: KeySort,
    /// `sorted` holds the keys of the last component collected, made by [`MaxMin::collect`]
    /// (no group flow was on any link), for [`MaxMin::fill`] to sort.
    keyed: bool,
    /// The lowest level of the flows that left since the last re-fill (infinite if none):
    /// below it, and below every changed link's equal share, the filling is what it was.
    threshold: f64,
    /// The last component collected is the flows at or above a positive threshold only (see
    /// [`MaxMin::collect`]): its links also carry flows kept at their rates.
    partial: bool,
    /// Re-fill whole components, never only the flows above a threshold (for tests that
    /// compare the two).
    pub(super) whole_components: bool,
    /// Re-fill every collected flow by the progressive filling, without the shortcuts for
    /// group flows alone on their links and for flows alone among the collected on theirs
    /// (for tests that compare the two: the rates are the same, bit for bit).
    pub(super) filling_every_flow: bool,
    /// Alone group flows the last collection settled at their rate alone.
    settled: usize,
    /// Per flow: [`MaxMin::epoch`] of the last collection that found it on a link with
    /// another collected flow (it is not alone among them).
    paired: Vec<u64>,
    /// Per link, the stamp of the last join, leave or capacity change there (empty until the
    /// first group flow joins: only [`Summary`]s read them).
    modified: Vec<u64>,
    /// The stamp of the last join, leave or capacity change.
    stamp: u64,
    /// Each group flow's [`Summary`] of its join, by flow id (as long as `spreads`).
    joined: Vec<Summary>,
    /// The [`Summary`]s of the group flows that left since the last collection, and their
    /// links.
    summaries: Vec<Summary>,
    summary_links: Vec<LinkId>,
    /// Scratch of [`MaxMin::join_group`]: what the other flows leave of each link joined.
    lefts: Vec<f64>,
}

impl<T: Copy> MaxMin<T> {
    /// A solver over links of `capacity` bytes per second each (indexed by `LinkId`).
    pub(super) fn new(capacity: Vec<f64>) -> Self {
        let links = capacity.len();
        MaxMin {
            nominal: Vec::new(),
            capacity,
            flows: Vec::new(),
            free_flows: Vec::new(),
            on_link: LinkLists::new(links),
            slots: Vec::new(),
            active_flows: 0,
            spreads: Vec::new(),
            edges: Vec::new(),
            // A list per link only once a group flow joins (see `join_group`).
            groups_on_link: Vec::new(),
            group_entries: 0,
            weighted_on_link: Vec::new(),
            solo: Vec::new(),
            epoch: 0,
            link_fill: vec![LinkFill::default(); links],
            flow_epoch: Vec::new(),
            component_links: Vec::new(),
            component_flows: Vec::new(),
            new_rate: Vec::new(),
            sorted: Vec::new(),
            heap: BinaryHeap::new(),
            key_sort: KeySort::default(),
            keyed: false,
            threshold: f64::INFINITY,
            partial: false,
            whole_components: false,
            filling_every_flow: false,
            settled: 0,
            paired: Vec::new(),
            modified: Vec::new(),
            stamp: 0,
            joined: Vec::new(),
            summaries: Vec::new(),
            summary_links: Vec::new(),
            lefts: Vec::new(),
        }
    }

    /// Room for `flows` flow slots in all (a hint: more may come).
    pub(super) fn reserve(&mut self, flows: usize) {
        let more = flows.saturating_sub(self.flows.len());
        self.flows.reserve(more);
        self.slots.reserve(more);
        self.flow_epoch.reserve(more);
        self.new_rate.reserve(more);
        self.paired.reserve(more);
    }

    /// The capacity of `link`, in bytes per second.
    #[inline]
    pub(super) fn capacity(&self, link: LinkId) -> f64 {
        self.capacity[link.0 as usize]
    }

    /// The capacity of `link` as built, in bytes per second, whatever window holds it below
    /// that now: what estimates of a flow's time alone use.
    #[inline]
    pub(super) fn nominal(&self, link: LinkId) -> f64 {
        let l = link.0 as usize;
        if self.nominal.is_empty() { self.capacity[l] } else { self.nominal[l] }
    }

    /// Sets the capacity of `link` now (0: down; its flows stall at rate 0 with no completion
    /// until it rises). The next re-fill covers whole components: a link whose capacity rose
    /// may free flows frozen at any level, so no rate is kept by threshold.
    pub(super) fn set_capacity(&mut self, link: LinkId, capacity: f64) {
        if self.nominal.is_empty() {
            // The first change: the capacities as built are kept from now on.
            self.nominal = self.capacity.clone();
        }
        self.capacity[link.0 as usize] = capacity;
        self.threshold = 0.0;
        self.touch(&[link]);
        // The rates alone of the group flows on it are found again when next asked for.
        if let Some(groups) = self.groups_on_link.get(link.0 as usize) {
            for &(flow, _) in groups {
                self.solo[flow as usize].alone = None;
            }
        }
    }

    /// Flow `id` (allocated by [`MaxMin::add`]).
    #[inline]
    pub(super) fn flow(&self, id: u32) -> &Flow<T> {
        &self.flows[id as usize]
    }

    /// Whether any flow (plain or group) is on `link`.
    #[inline]
    pub(super) fn is_busy(&self, link: LinkId) -> bool {
        let l = link.0 as usize;
        !self.on_link.is_empty(l)
            || (self.group_entries > 0 && !groups_of(&self.groups_on_link, l).is_empty())
    }

    /// Whether a seed (a link, or one that stands for several: see [`MaxMin::collect`]) has a
    /// flow on a link of it, as of when it was made: a group flow's join is on its links,
    /// and a leave's summary is made only where a flow stays on one of them.
    pub(super) fn is_busy_seed(&self, seed: LinkId) -> bool {
        group_seed(seed.0).is_some() || leave_seed(seed.0).is_some() || self.is_busy(seed)
    }

    /// A capacity changed on `links`: a new stamp for them (see [`Summary`]).
    fn touch(&mut self, links: &[LinkId]) {
        if self.modified.is_empty() {
            return;
        }
        self.stamp += 1;
        for link in links {
            self.modified[link.0 as usize] = self.stamp;
        }
    }

    /// In one pass over link `l`'s lists: what its flows other than flow `except` leave of
    /// its capacity, subtracted in the order a collection's scan subtracts kept flows (plain
    /// flows, then group flows, each in list order); the fastest of their rates (infinite for
    /// one with no rate yet, which is never kept); and the link's weight, as
    /// [`MaxMin::link_weight`] sums it (a sum of positive weights is the same from 0 or -0).
    fn kept_on(&self, l: usize, except: u32) -> (f64, f64, f64) {
        let (mut left, mut fastest, mut weight) = (self.capacity[l], f64::NEG_INFINITY, 0.0);
        let speed =
            |flow: &Flow<T>| if flow.rate == 0.0 && !flow.stalled { f64::INFINITY } else { flow.rate };
        let plain = self.on_link.get(l);
        for &f in plain {
            let flow = &self.flows[f as usize];
            left -= flow.rate;
            fastest = fastest.max(speed(flow));
        }
        for &(f, claim) in groups_of(&self.groups_on_link, l) {
            weight += claim;
            if f != except {
                let flow = &self.flows[f as usize];
                left -= flow.rate * claim;
                fastest = fastest.max(speed(flow));
            }
        }
        (left, fastest, f64::from(plain.len() as u32) + weight)
    }

    /// What each flow on `link` carries over it now, in bytes per second: a plain flow's rate,
    /// a group flow's rate times its weight there.
    pub(super) fn link_rates(&self, link: LinkId) -> impl Iterator<Item = f64> + '_ {
        let l = link.0 as usize;
        let plain = self.on_link.get(l).iter().map(|&f| self.flows[f as usize].rate);
        let groups = groups_of(&self.groups_on_link, l).iter();
        plain.chain(groups.map(|&(f, weight)| self.flows[f as usize].rate * weight))
    }

    /// How many flows are on their links (a group flow counts its edges).
    #[inline]
    pub(super) fn active_flows(&self) -> usize {
        self.active_flows
    }

    /// The spread of flow `id`: its links with their weights if it is a group flow, empty for
    /// a plain flow.
    #[inline]
    pub(super) fn spread(&self, id: u32) -> &[SpreadLink] {
        self.spreads.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// The flows of the last component collected ([`MaxMin::collect`]).
    pub(super) fn component(&self) -> &[u32] {
        &self.component_flows
    }

    /// A flow of `bytes` on `route` for `owner`, not yet on its links, at rate 0; a plain
    /// flow. Returns its id (a slot freed earlier, or a new one).
    #[inline]
    pub(super) fn add(&mut self, now: SimTime, route: &Route, bytes: f64, owner: T) -> u32 {
        if let Some(id) = self.free_flows.pop() {
            // Field by field into the slot (what `allocate` does, without a whole flow built
            // beside it and copied in: a plain flow per message makes that copy a hot spot).
            let slot = &mut self.flows[id as usize];
            slot.route = *route;
            slot.size = bytes;
            slot.remaining = bytes;
            slot.rate = 0.0;
            slot.updated = now;
            slot.generation = slot.generation.wrapping_add(1);
            slot.owner = owner;
            slot.group = NO_GROUP;
            slot.stalled = false;
            return id;
        }
        self.allocate(Flow {
            route: *route,
            size: bytes,
            remaining: bytes,
            rate: 0.0,
            updated: now,
            generation: 0,
            owner,
            group: NO_GROUP,
            stalled: false,
        })
    }

    /// A group flow for `owner`'s group `group`, not yet on its links: it stands for `edges`
    /// edges that advance at one rate per unit of weight, crossing `spread` (each link once),
    /// and is done when `size` bytes per unit of weight have moved (the edge that needs the
    /// most at its weight). Returns its id.
    pub(super) fn add_group(
        &mut self,
        now: SimTime,
        group: u32,
        spread: &[SpreadLink],
        size: f64,
        edges: u32,
        owner: T,
    ) -> u32 {
        let id = self.allocate(Flow {
            route: Route::EMPTY,
            size,
            remaining: size,
            rate: 0.0,
            updated: now,
            generation: 0,
            owner,
            group,
            stalled: false,
        });
        let slot = id as usize;
        if self.spreads.len() <= slot {
            self.spreads.resize_with(slot + 1, Vec::new);
            self.edges.resize(slot + 1, 0);
            self.solo.resize(slot + 1, Solo::default());
            self.joined.resize(slot + 1, Summary::default());
        }
        self.spreads[slot].clear();
        self.spreads[slot].extend_from_slice(spread);
        self.edges[slot] = edges;
        self.solo[slot] = Solo::default();
        self.joined[slot] = Summary::default();
        id
    }

    /// Puts `flow` in a free slot (its generation continues the slot's), or a new one.
    #[inline]
    fn allocate(&mut self, mut flow: Flow<T>) -> u32 {
        match self.free_flows.pop() {
            Some(id) => {
                // Generations keep counting across reuse of a slot, so a stale completion of the
                // slot's previous flow can never match the new one.
                let slot = &mut self.flows[id as usize];
                flow.generation = slot.generation.wrapping_add(1);
                *slot = flow;
                id
            }
            None => {
                self.flows.push(flow);
                self.slots.push([0; Route::CAPACITY]);
                self.flow_epoch.push(0);
                self.new_rate.push(0.0);
                self.paired.push(0);
                (self.flows.len() - 1) as u32
            }
        }
    }

    /// Flow `id`'s first byte has arrived: it joins its links.
    #[inline]
    pub(super) fn join(&mut self, id: u32, now: SimTime) -> Joined {
        let flow = &mut self.flows[id as usize];
        flow.updated = now;
        if flow.remaining <= 0.0 || flow.route.is_empty() {
            return Joined::Empty;
        }
        if !self.modified.is_empty() {
            self.stamp += 1;
        }
        let route = &self.flows[id as usize].route;
        // One pass: its place on each link, whether it is the first there, and its slowest
        // link's capacity (the rate it gets if it is alone on all of them).
        let slots = &mut self.slots[id as usize];
        let (mut first_everywhere, mut rate) = (true, f64::INFINITY);
        for (k, &link) in route.iter().enumerate() {
            let l = link.0 as usize;
            if let Some(modified) = self.modified.get_mut(l) {
                *modified = self.stamp;
            }
            if self.group_entries > 0 {
                arrive(&self.on_link, &self.groups_on_link, &mut self.solo, l);
            }
            let position = self.on_link.push(l, id);
            slots[k] = position;
            first_everywhere &= position == 0;
            rate = rate.min(self.capacity[l]);
        }
        self.active_flows += 1;
        if first_everywhere
            && (self.group_entries == 0
                || route.iter().all(|link| groups_of(&self.groups_on_link, link.0 as usize).is_empty()))
        {
            // Alone on every link (the common uncontended case): its bottleneck's full rate,
            // and nobody else's rate changes. (A route crossing a link twice is not first
            // there the second time: shared, as it is with itself.)
            let flow = &mut self.flows[id as usize];
            flow.rate = rate;
            flow.stalled = rate == 0.0;
            flow.generation = flow.generation.wrapping_add(1);
            let generation = flow.generation;
            return Joined::Alone { delay: due_in(flow.remaining, rate), generation };
        }
        Joined::Shared
    }

    /// Group flow `id` joins every link of its spread at once; they are appended to `seeds`,
    /// as one [`GROUP_SEED`] that stands for them all (unless `filling_every_flow`).
    pub(super) fn join_group(&mut self, id: u32, now: SimTime, seeds: &mut Vec<LinkId>) {
        let flow = &mut self.flows[id as usize];
        flow.updated = now;
        if self.groups_on_link.is_empty() {
            // The first group flow: a list per link (one empty `Vec` each, not cloned).
            let links = self.capacity.len();
            self.groups_on_link = std::iter::repeat_with(Vec::new).take(links).collect();
            self.weighted_on_link = vec![0; links];
            self.modified = vec![0; links];
        }
        self.stamp += 1;
        let mut shared = 0;
        let spread = &self.spreads[id as usize];
        for entry in spread {
            let l = entry.link.0 as usize;
            self.modified[l] = self.stamp;
            if !self.on_link.is_empty(l) || !self.groups_on_link[l].is_empty() {
                shared += 1;
            }
            arrive(&self.on_link, &self.groups_on_link, &mut self.solo, l);
            self.groups_on_link[l].push((id, entry.weight));
            self.group_entries += 1;
            if entry.weighted {
                self.weighted_on_link[l] += 1;
            }
            if self.filling_every_flow {
                seeds.push(entry.link);
            }
        }
        self.solo[id as usize] = Solo { shared, alone: None };
        if !self.filling_every_flow && !spread.is_empty() {
            if shared > 0 {
                // The other flows on its links: the fastest, what they leave of each, and the
                // threshold the links give.
                let (mut fastest, mut threshold, mut weighted) = (f64::NEG_INFINITY, f64::INFINITY, false);
                let mut lefts = std::mem::take(&mut self.lefts);
                lefts.clear();
                for entry in spread {
                    let l = entry.link.0 as usize;
                    let (left, faster, link_weight) = self.kept_on(l, id);
                    lefts.push(left);
                    fastest = fastest.max(faster);
                    weighted |= self.weighted_on_link[l] != 0;
                    threshold = threshold.min(self.capacity[l] / link_weight);
                }
                let threshold = if weighted { 0.0 } else { threshold };
                // The re-fill's threshold is at most the links' own: a summary whose fastest
                // other flow is not below it is never used, and needs no rate.
                let mut rate = f64::NAN;
                if fastest < threshold * (1.0 - 1e-9) {
                    // As a collection's scan and a partial filling find it: the largest-key
                    // share of what the kept flows leave (its own weight summed from 0, no
                    // less than `MIN_WEIGHT`).
                    let mut best = None;
                    for (entry, &left) in spread.iter().zip(&lefts) {
                        let share = left.max(0.0) / f64::max(0.0 + entry.weight, MIN_WEIGHT);
                        let key = Some(order_key(share, entry.link.0));
                        if key > best {
                            (best, rate) = (key, share);
                        }
                    }
                }
                self.lefts = lefts;
                let stamp = self.stamp;
                self.joined[id as usize] =
                    Summary { stamp, fastest, threshold, rate, holds: false, start: 0, end: 0 };
            }
            seeds.push(LinkId(GROUP_SEED | id));
        }
        self.active_flows += self.edges[id as usize] as usize;
    }

    /// True if flow `id` is on its links at the rate it had at `generation`: a completion
    /// scheduled then is due now.
    #[inline]
    pub(super) fn is_due(&self, id: u32, generation: u32) -> bool {
        let flow = &self.flows[id as usize];
        flow.generation == generation && flow.rate != 0.0
    }

    /// Flow `id` (in no group) has delivered its last byte: it leaves its links, at rate 0
    /// with nothing left. Returns whether any of its links still carries a flow (whose rate
    /// may then rise: its component needs a re-fill).
    #[inline]
    pub(super) fn leave(&mut self, id: u32) -> bool {
        if !self.modified.is_empty() {
            self.stamp += 1;
        }
        let route = &self.flows[id as usize].route;
        for (k, &link) in route.iter().enumerate() {
            let l = link.0 as usize;
            if let Some(modified) = self.modified.get_mut(l) {
                *modified = self.stamp;
            }
            let position = self.slots[id as usize][k];
            debug_assert_eq!(
                self.on_link.get(l).get(position as usize),
                Some(&id),
                "flow {id}'s slot on link {}",
                link.0
            );
            // The link's last flow moved into the hole: its slot on this link follows it.
            if let Some(moved) = self.on_link.swap_remove(l, position) {
                let last = self.on_link.len(l) as u32;
                let moved_route = &self.flows[moved as usize].route;
                let slots = &mut self.slots[moved as usize];
                for (j, &other) in moved_route.iter().enumerate() {
                    if other == link && slots[j] == last {
                        slots[j] = position;
                    }
                }
            }
            if self.group_entries > 0 {
                depart(&self.on_link, &self.groups_on_link, &mut self.solo, l);
            }
        }
        self.active_flows -= 1;
        let shared = route.iter().any(|&link| self.is_busy(link));
        let flow = &mut self.flows[id as usize];
        if shared {
            self.threshold = self.threshold.min(flow.rate);
        }
        flow.rate = 0.0;
        flow.remaining = 0.0;
        flow.generation = flow.generation.wrapping_add(1);
        shared
    }

    /// Frees flow `id`'s slot (off its links, or never on them) for reuse.
    #[inline]
    pub(super) fn free(&mut self, id: u32) {
        self.free_flows.push(id);
    }

    /// Group flow `id` leaves every link of its spread at once and is freed. The links it
    /// leaves are appended to `seeds`, each once; none if it was alone on all of them (they
    /// carry nothing now; unless `filling_every_flow`).
    pub(super) fn leave_group(&mut self, id: u32, seeds: &mut Vec<LinkId>) {
        let mut spread = std::mem::take(&mut self.spreads[id as usize]);
        let alone = self.solo.get(id as usize).is_some_and(|solo| solo.shared == 0);
        let seeded = self.filling_every_flow || !alone;
        // Its links summed up as one seed (see `Summary`) instead of seeded one by one.
        let summed = seeded && !self.filling_every_flow && !self.modified.is_empty();
        let start = self.summary_links.len() as u32;
        let (mut fastest, mut threshold, mut weighted, mut busy) =
            (f64::NEG_INFINITY, f64::INFINITY, false, false);
        self.stamp += 1;
        for entry in &spread {
            let l = entry.link.0 as usize;
            if let Some(modified) = self.modified.get_mut(l) {
                *modified = self.stamp;
            }
            // No lists yet: no group flow ever joined, this one included.
            if let Some(list) = self.groups_on_link.get_mut(l) {
                if let Some(position) = list.iter().position(|&(flow, _)| flow == id) {
                    // Order kept: the filling visits a link's group flows in the order they
                    // joined.
                    list.remove(position);
                    self.group_entries -= 1;
                    depart(&self.on_link, &self.groups_on_link, &mut self.solo, l);
                }
                if entry.weighted {
                    self.weighted_on_link[l] -= 1;
                }
            }
            if summed {
                // What a seed of this link would give the threshold, as `collect` does.
                if self.is_busy(entry.link) {
                    let (_, faster, link_weight) = self.kept_on(l, NO_GROUP);
                    busy = true;
                    fastest = fastest.max(faster);
                    if self.weighted_on_link[l] != 0 {
                        weighted = true;
                    } else {
                        threshold = threshold.min(self.capacity[l] / link_weight);
                    }
                }
                self.summary_links.push(entry.link);
            } else if seeded {
                seeds.push(entry.link);
            }
        }
        if summed && busy {
            let (end, threshold) = (self.summary_links.len() as u32, if weighted { 0.0 } else { threshold });
            let stamp = self.stamp;
            self.summaries.push(Summary {
                stamp,
                fastest,
                threshold,
                rate: f64::NAN,
                holds: false,
                start,
                end,
            });
            seeds.push(LinkId(LEAVE_SEED | (self.summaries.len() - 1) as u32));
        } else if summed {
            // Nothing on its links any more: nothing to re-fill there.
            self.summary_links.truncate(start as usize);
        }
        if let Some(solo) = self.solo.get_mut(id as usize) {
            *solo = Solo::default();
        }
        // Cleared, its allocation kept for the slot's next group flow.
        spread.clear();
        self.spreads[id as usize] = spread;
        self.active_flows -= self.edges[id as usize] as usize;
        self.edges[id as usize] = 0;
        let flow = &mut self.flows[id as usize];
        self.threshold = self.threshold.min(flow.rate);
        flow.rate = 0.0;
        flow.remaining = 0.0;
        flow.generation = flow.generation.wrapping_add(1);
        flow.group = NO_GROUP;
        self.free_flows.push(id);
    }

    /// Collects the component to re-fill: every flow connected to `seeds` through shared
    /// links (a grouped flow brings its whole group), except the flows whose rates cannot
    /// change. Returns its flows and links.
    ///
    /// Which rates cannot change: progressive filling raises every unfrozen flow together, so
    /// it is a sequence of levels. A flow that left at level `r` had no link full below `r`
    /// (it would have frozen there), so without it the filling below `r` is what it was; a
    /// flow that joined a link of equal share `c / w` (its capacity over the weight now on
    /// it) cannot fill that link below `c / w`. Below the threshold, the least of those
    /// levels, every flow freezes where it froze before: the flows already frozen below it
    /// keep their rates, and only the flows at or above it (and those that just joined) are
    /// re-filled, on what the kept flows leave of each link. When the fastest flow of a
    /// congested component finishes, that is the few flows of its own level instead of the
    /// whole component. The threshold is lowered by one part in 10^9 so that levels equal in
    /// exact arithmetic but not in the last bit are re-filled too.
    pub(super) fn collect(&mut self, seeds: &[LinkId]) -> (usize, usize) {
        // Two marks per recomputation: `epoch` = in the component, `epoch + 1` = frozen.
        self.epoch = self.epoch.wrapping_add(2);
        let epoch = self.epoch;
        self.component_links.clear();
        self.component_flows.clear();
        self.settled = 0;
        let shortcuts = !self.filling_every_flow;
        // The threshold, over every seed: what a link gives it, each link once (a link seeded
        // twice gives it the same again).
        let mut threshold = std::mem::replace(&mut self.threshold, f64::INFINITY);
        for &seed in seeds {
            if let Some(group) = group_seed(seed.0) {
                if self.solo[group].shared == 0 {
                    // A group flow that joined, alone on its links: what they would give the
                    // threshold, each its capacity over the group's weight there or 0 where
                    // weighted, is its rate alone or 0.
                    let (rate, weighted) = self.solo[group].alone(&self.spreads[group], &self.capacity);
                    threshold = if weighted { 0.0 } else { threshold.min(rate) };
                } else if self.holds(self.joined[group], &self.spreads[group]) {
                    self.joined[group].holds = true;
                    threshold = threshold.min(self.joined[group].threshold);
                } else {
                    self.joined[group].holds = false;
                    for entry in &self.spreads[group] {
                        threshold = self.threshold_at(entry.link, threshold);
                    }
                }
            } else if let Some(index) = leave_seed(seed.0) {
                let summary = self.summaries[index];
                let links = &self.summary_links[summary.start as usize..summary.end as usize];
                let holds = self.holds_on(summary, links.iter().copied());
                self.summaries[index].holds = holds;
                if holds {
                    threshold = threshold.min(summary.threshold);
                } else {
                    for &link in links {
                        threshold = self.threshold_at(link, threshold);
                    }
                }
            } else {
                threshold = self.threshold_at(seed, threshold);
            }
        }
        let threshold = if self.whole_components { 0.0 } else { threshold * (1.0 - 1e-9) };
        // The queue, seeds first in their order. A group flow that joined alone, or whose
        // summary holds with every other flow on its links kept, stays one entry (settled in
        // its turn, see below), its links unvisited; a group flow's links that it left, when
        // their summary holds and every flow on them is kept, are not visited (their visit
        // would have found kept flows only: a partial collection). Otherwise their links, in
        // their place.
        let mut partial = false;
        for &seed in seeds {
            if let Some(group) = group_seed(seed.0) {
                let summary = self.joined[group];
                if self.solo[group].shared == 0 {
                    self.new_rate[group] = self.solo[group].alone(&self.spreads[group], &self.capacity).0;
                    self.component_links.push(seed.0);
                } else if summary.holds && summary.fastest < threshold {
                    self.new_rate[group] = summary.rate;
                    partial = true;
                    self.component_links.push(seed.0);
                } else {
                    for index in 0..self.spreads[group].len() {
                        let link = self.spreads[group][index].link;
                        self.seed(link);
                    }
                }
            } else if let Some(index) = leave_seed(seed.0) {
                let summary = self.summaries[index];
                if summary.holds && summary.fastest < threshold {
                    partial = true;
                } else {
                    for at in summary.start..summary.end {
                        let link = self.summary_links[at as usize];
                        self.seed(link);
                    }
                }
            } else {
                self.seed(seed);
            }
        }
        self.summaries.clear();
        self.summary_links.clear();
        // Breadth-first over links -> flows -> links (a group flow brings its whole spread),
        // on separate borrows of the lists and marks. Each link's flows are all classified
        // when the link is scanned (a flow not kept is collected then, if not before), so the
        // scan also finds what the kept flows leave of the link and the count and weight of
        // the others, which a partial filling starts from (see [`MaxMin::fill`]): in the
        // order of the link's lists, the arithmetic the filling did when it scanned them again.
        // With no group flow on any link, the filling's starting shares are the ones found
        // here whether or not the collection is partial (a link's flows each weigh 1, so the
        // weight summed here is the count the whole filling starts from): the filling's keys
        // are made here as each link is scanned, in the order `fill` would make them.
        //
        // With group flows, the shortcuts (unless `filling_every_flow`): a group flow alone on
        // every link of its spread is settled when visited, at its rate alone (what the
        // filling would freeze it at: nothing else on its links moves their shares), its
        // links not queued; and the scan marks the collected flows that share a link with
        // another collected flow (`paired`), so that the filling can settle the others
        // without popping their links (see [`MaxMin::fill`]).
        let keyed = self.group_entries == 0;
        self.keyed = keyed;
        let pairing = shortcuts && !keyed;
        let MaxMin {
            capacity,
            flows,
            on_link,
            spreads,
            groups_on_link,
            link_fill,
            flow_epoch,
            component_links,
            component_flows,
            sorted,
            solo,
            new_rate,
            settled,
            paired,
            ..
        } = self;
        sorted.clear();
        let mut next = 0;
        while next < component_links.len() {
            let entry = component_links[next];
            next += 1;
            let mut marks = Marks {
                epoch,
                threshold,
                shortcuts,
                flow_epoch,
                link_fill,
                component_flows,
                component_links,
                solo,
                capacity,
                new_rate,
                settled,
            };
            if let Some(group) = group_seed(entry) {
                // A settled group flow's turn (its rate found above): where the first of its
                // links would have been scanned, if no earlier link had it visited (then as
                // that visit found it), so the component's order is the same.
                if marks.flow_epoch[group] < epoch {
                    marks.flow_epoch[group] = epoch + 1;
                    marks.component_flows.push(group as u32);
                    *marks.settled += 1;
                }
                continue;
            }
            let link = entry as usize;
            let (mut left, mut count, mut weight) = (capacity[link], 0u32, 0.0);
            // The first flow collected here, and whether another one was.
            let mut first = u32::MAX;
            let mut pair = |flow: u32, count: u32| {
                if pairing {
                    if count == 0 {
                        first = flow;
                    } else {
                        paired[flow as usize] = epoch;
                        paired[first as usize] = epoch;
                    }
                }
            };
            for &flow in on_link.get(link) {
                match marks.visit(flow, flows, spreads) {
                    Some(rate) => {
                        partial = true;
                        left -= rate;
                    }
                    None => {
                        pair(flow, count);
                        count += 1;
                        weight += 1.0;
                    }
                }
            }
            for &(flow, claim) in groups_of(groups_on_link, link) {
                match marks.visit(flow, flows, spreads) {
                    Some(rate) => {
                        partial = true;
                        left -= rate * claim;
                    }
                    None => {
                        pair(flow, count);
                        count += 1;
                        weight += claim;
                    }
                }
            }
            let state = &mut link_fill[link];
            state.remaining = left.max(0.0);
            state.unfrozen = count;
            state.unfrozen_weight = f64::max(weight, MIN_WEIGHT);
            state.first = first;
            if keyed && count > 0 {
                sorted.push(order_key(state.remaining / state.unfrozen_weight, link as u32));
            }
        }
        self.partial = partial;
        (self.component_flows.len(), self.component_links.len())
    }

    /// `threshold` lowered to the share of what joined or left `link` (0 where a weighted
    /// group is: see [`MaxMin::collect`]).
    #[inline(always)]
    fn threshold_at(&self, link: LinkId, threshold: f64) -> f64 {
        let l = link.0 as usize;
        if self.weighted_on_link.get(l).is_some_and(|&weighted| weighted != 0) {
            // A weighted group's claim is not a count of flows: the whole component, as before
            // thresholds.
            0.0
        } else if self.is_busy(link) {
            threshold.min(self.capacity[l] / self.link_weight(l))
        } else {
            threshold
        }
    }

    /// Queues `link` into the component being collected, once.
    #[inline(always)]
    fn seed(&mut self, link: LinkId) {
        let l = link.0 as usize;
        if self.link_fill[l].epoch != self.epoch {
            self.link_fill[l].epoch = self.epoch;
            self.component_links.push(link.0);
        }
    }

    /// Whether `summary` of a group flow's join over `spread` still holds.
    fn holds(&self, summary: Summary, spread: &[SpreadLink]) -> bool {
        summary.stamp != 0 && self.holds_on(summary, spread.iter().map(|entry| entry.link))
    }

    /// Whether `summary` still holds over `links`: none changed since.
    fn holds_on(&self, summary: Summary, mut links: impl Iterator<Item = LinkId>) -> bool {
        links.all(|link| self.modified[link.0 as usize] <= summary.stamp)
    }

    /// The max-min fair rates of the component collected last (not applied yet: see
    /// [`MaxMin::update`]).
    pub(super) fn solve(&mut self) {
        if self.settled == self.component_flows.len() {
            // Every flow collected was alone on its links: settled at its rate alone.
            return;
        }
        if self.partial {
            // The component's links also carry kept flows: the general filling, on what they
            // leave of each link.
            self.fill();
        } else if let [flow] = self.component_flows[..] {
            // A flow alone on its links (the common uncontended case) runs at its bottleneck;
            // a group flow alone, at its links' smallest capacity per unit of its weight there
            // (the first share the filling would pop).
            let route = self.flows[flow as usize].route;
            let rate = route.iter().map(|l| self.capacity[l.0 as usize]).fold(f64::INFINITY, f64::min);
            let rate = self
                .spread(flow)
                .iter()
                .map(|entry| self.capacity[entry.link.0 as usize] / entry.weight)
                .fold(rate, f64::min);
            self.new_rate[flow as usize] = rate;
        } else {
            self.fill();
        }
    }

    /// Applies the rates [`MaxMin::solve`] found: every flow of the component whose rate
    /// changed is brought up to date at `now` (its remaining bytes at the old rate), takes its
    /// new rate and a new generation, and is passed to `changed` with the time its last byte
    /// is due at that rate (rounded up to the picosecond; `None` at rate 0: a link of its
    /// route is down), in component order.
    pub(super) fn update<E>(
        &mut self,
        now: SimTime,
        mut changed: impl FnMut(u32, &Flow<T>, &[SpreadLink], Option<SimDuration>) -> Result<(), E>,
    ) -> Result<(), E> {
        for index in 0..self.component_flows.len() {
            let id = self.component_flows[index] as usize;
            let rate = self.new_rate[id];
            let flow = &mut self.flows[id];
            if rate == flow.rate {
                // A flow that joined onto a link that is down froze at 0: stalled now.
                flow.stalled |= rate == 0.0;
                continue;
            }
            let elapsed = now.saturating_since(flow.updated).as_secs_f64();
            flow.remaining = (flow.remaining - flow.rate * elapsed).max(0.0);
            flow.updated = now;
            flow.rate = rate;
            flow.stalled = rate == 0.0;
            flow.generation = flow.generation.wrapping_add(1);
            let spread = self.spreads.get(id).map_or(&[][..], Vec::as_slice);
            changed(id as u32, flow, spread, due_in(flow.remaining, rate))?;
        }
        Ok(())
    }

    /// The summed weight of the flows on link `l`: a plain flow weighs 1, a group flow its
    /// weight there.
    fn link_weight(&self, l: usize) -> f64 {
        link_weight(self.on_link.get(l), groups_of(&self.groups_on_link, l))
    }

    /// Progressive filling over the current component with a min-heap of link fair shares.
    /// Flows of the component are marked `epoch`; each is marked `epoch + 1` once its rate is
    /// frozen.
    ///
    /// The heap is lazy: freezing a flow lowers its links' remaining capacity and weight but
    /// pushes nothing. A link's fair share never falls while the filling runs (a flow freezes
    /// at the smallest share `s <= r / w` of its links, which leaves another link of it at
    /// `(r - a s) / (w - a) >= r / w`), so an entry's key is a lower bound of its link's
    /// share: a popped link whose share has grown since goes back in at its current share, and
    /// the first link popped at its current share is the bottleneck. Each link has one entry at
    /// a time; a freeze costs its routes' arithmetic, not a heap push per link it crosses, and
    /// the filling stops when the last flow freezes instead of draining the heap.
    ///
    /// After a partial collection each link starts with what the flows kept at their rates
    /// leave of it, and only the component's flows count in its weight (as
    /// [`MaxMin::collect`] found them, scanning the link's flows once for both).
    ///
    /// Shortcuts with group flows (see [`MaxMin::collect`]): a flow the collection settled
    /// (alone on its links) is frozen already. A flow that shares no link with another
    /// collected flow is settled before the pops: on its links nothing else is filled, so
    /// their shares stay as they start until it freezes, at the first of them popped, the
    /// one of the largest key; and its freezing changes no other flow's links. Its links
    /// are then left out of the keys, and the pops of the others are the same, in the same
    /// order (each key is its own link's), with the same arithmetic.
    fn fill(&mut self) {
        // The scratch and the lists as separate borrows: the loops below index them directly.
        let MaxMin {
            capacity,
            flows,
            on_link,
            spreads,
            groups_on_link,
            flow_epoch,
            link_fill,
            component_links,
            component_flows,
            new_rate,
            sorted,
            heap,
            key_sort,
            partial,
            keyed,
            epoch,
            settled,
            paired,
            filling_every_flow,
            ..
        } = self;
        let (partial, epoch) = (*partial, *epoch);
        let frozen = epoch.wrapping_add(1);
        heap.clear();
        let mut unfrozen_flows = component_flows.len() - *settled;
        // Unless `collect` made the keys (no group flow on any link), they are made here.
        if !*keyed {
            sorted.clear();
            // After a partial collection, `collect` has set what the kept flows leave.
            if !partial {
                for &link in component_links.iter() {
                    let l = link as usize;
                    if group_seed(link).is_some() {
                        continue;
                    }
                    let state = &mut link_fill[l];
                    let (plain, groups) = (on_link.get(l), groups_of(groups_on_link, l));
                    state.remaining = capacity[l];
                    state.unfrozen = (plain.len() + groups.len()) as u32;
                    state.unfrozen_weight = link_weight(plain, groups);
                }
            }
            if !*filling_every_flow {
                // The flows that share no link with another collected one.
                for &flow in component_flows.iter() {
                    let f = flow as usize;
                    if flow_epoch[f] != epoch || paired[f] == epoch {
                        continue;
                    }
                    let (mut best, mut rate) = (None, f64::INFINITY);
                    let spread = spreads.get(f).map_or(&[][..], Vec::as_slice);
                    let links = flows[f].route.iter().copied().chain(spread.iter().map(|entry| entry.link));
                    for link in links {
                        let state = &link_fill[link.0 as usize];
                        let share = state.remaining / state.unfrozen_weight;
                        let key = Some(order_key(share, link.0));
                        if key > best {
                            (best, rate) = (key, share);
                        }
                    }
                    flow_epoch[f] = frozen;
                    unfrozen_flows -= 1;
                    new_rate[f] = rate;
                }
            }
            if unfrozen_flows == 0 {
                return;
            }
            for &link in component_links.iter() {
                if group_seed(link).is_some() {
                    continue;
                }
                let state = &link_fill[link as usize];
                if state.unfrozen == 0 {
                    continue;
                }
                // A link of a settled flow alone among the collected: nothing to decide.
                if !*filling_every_flow && state.unfrozen == 1 && flow_epoch[state.first as usize] == frozen {
                    continue;
                }
                let share = state.remaining / state.unfrozen_weight;
                sorted.push(order_key(share, link));
            }
        }
        // Sorted (the next link last) instead of a heap of every link: a link is popped at
        // most once at the share it started with, from the end of a vector; only a link whose
        // share has grown goes into the heap. The order of pops is a heap's of every entry: the
        // larger of the two sources' next entries (every entry has its own link, so they never
        // tie). Sorted a chunk at a time (see `sort_largest`): at first as many links as there
        // are flows to freeze, each popped link freezing at least one or none.
        let mut chunk = unfrozen_flows.max(1);
        let mut unsorted = sort_largest(sorted, chunk, key_sort);
        // Once every flow is frozen the links left in the heap have nothing to decide.
        while unfrozen_flows > 0 {
            if sorted.len() == unsorted && unsorted > 0 {
                // The sorted chunk is popped: what is left is below it.
                chunk = chunk.saturating_mul(2);
                unsorted = sort_largest(sorted, chunk, key_sort);
            }
            let Some(entry) = next_link(sorted, heap) else { break };
            let (key, link) = share_and_link(entry);
            let l = link as usize;
            let state = link_fill[l];
            if state.unfrozen == 0 {
                continue;
            }
            let share = state.remaining / state.unfrozen_weight;
            if share > key {
                heap.push(order_key(share, link));
                continue;
            }
            // Every unfrozen flow on the bottleneck freezes at its share: a plain flow at the
            // share, a group flow at the share per unit of weight (each of its edges at the
            // share times its own weight), taking that times its weight from each of its links.
            for &flow in on_link.get(l) {
                let f = flow as usize;
                if flow_epoch[f] != epoch {
                    continue; // already frozen
                }
                flow_epoch[f] = frozen;
                unfrozen_flows -= 1;
                new_rate[f] = share;
                for &other in flows[f].route.iter() {
                    link_fill[other.0 as usize].take(share, 1.0);
                }
            }
            for &(flow, _) in groups_of(groups_on_link, l) {
                let f = flow as usize;
                if flow_epoch[f] != epoch {
                    continue; // already frozen
                }
                flow_epoch[f] = frozen;
                unfrozen_flows -= 1;
                new_rate[f] = share;
                for entry in &spreads[f] {
                    link_fill[entry.link.0 as usize].take(share, entry.weight);
                }
            }
        }
    }

    /// The capacity and bottleneck conditions of max-min fairness on the component re-filled
    /// last: the last violation found, if any (for audits; a pass over the component).
    pub(super) fn violation(&self) -> Option<String> {
        let mut violation = None;
        let load = |l: usize| -> f64 { self.link_rates(LinkId(l as u32)).sum() };
        for &link in &self.component_links {
            if group_seed(link).is_some() {
                continue; // an alone group flow, settled at its rate alone
            }
            let l = link as usize;
            let load = load(l);
            if load > self.capacity[l] * (1.0 + 1e-9) {
                violation = Some(format!("link {link} carries {load} B/s, capacity {}", self.capacity[l]));
            }
        }
        for &flow in &self.component_flows {
            if self.flows[flow as usize].group != NO_GROUP {
                // A group flow may be held below a link's share by its edges elsewhere.
                continue;
            }
            let rate = self.flows[flow as usize].rate;
            let has_bottleneck = self.flows[flow as usize].route.iter().any(|&link| {
                let l = link.0 as usize;
                // The fastest claim per unit of weight: a plain flow's rate, a group's level.
                let fastest = self
                    .on_link
                    .get(l)
                    .iter()
                    .chain(groups_of(&self.groups_on_link, l).iter().map(|(flow, _)| flow))
                    .map(|&f| self.flows[f as usize].rate)
                    .fold(0.0, f64::max);
                load(l) >= self.capacity[l] * (1.0 - 1e-9) && rate >= fastest * (1.0 - 1e-9)
            });
            if !has_bottleneck {
                violation = Some(format!("flow {flow} at {rate} B/s has no bottleneck link"));
            }
        }
        violation
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::ceil_to_u64;
    use crate::flow::link_order::{KeySort, order_key, sort_largest, sort_order_keys};

    /// Values where rounding up is delicate: integers, their neighbours, the ends of the
    /// ranges where floats stop having fractions (2^52, 2^53) and stop fitting (2^64).
    fn edge_values() -> Vec<f64> {
        let mut values = vec![0.0, -0.0, 0.5, 1.0, -0.5, -1.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY];
        for power in [1.0, 1e12, 2f64.powi(52), 2f64.powi(53), 2f64.powi(63), 2f64.powi(64)] {
            values.extend([power, power.next_up(), power.next_down(), power + 0.5]);
        }
        values
    }

    #[test]
    fn ceil_to_u64_is_ceil_then_cast_at_the_edges() {
        for x in edge_values() {
            assert_eq!(ceil_to_u64(x), x.ceil() as u64, "{x:e}");
        }
    }

    proptest! {
        /// Rounding up to a whole picosecond without libm gives what `ceil` and the cast give,
        /// for times of any size, fractions included.
        #[test]
        fn ceil_to_u64_is_ceil_then_cast(
            x in prop_oneof![0.0f64..1e6, 0.0f64..1e18, 1e18f64..1e20, any::<f64>()],
        ) {
            prop_assert_eq!(ceil_to_u64(x), x.ceil() as u64);
        }

        /// Popping from the end and sorting the next chunk whenever the sorted one is gone (as
        /// the filling does, the chunk doubling each time) gives the keys in the order of a
        /// whole sort, from the largest down, whatever the first chunk.
        #[test]
        fn chunks_pop_as_a_whole_sort(
            links in prop::collection::btree_map(0u32..5_000, 0usize..40, 0..400),
            shares in prop::collection::vec(0.0f64..1e12, 40),
            chunk in 1usize..64,
        ) {
            let keys: Vec<u128> = links.iter().map(|(&link, &pick)| order_key(shares[pick], link)).collect();
            let mut expected = keys.clone();
            expected.sort_unstable();
            expected.reverse();
            let mut scratch = KeySort::default();
            let mut sorted = keys;
            let mut chunk = chunk;
            let mut unsorted = sort_largest(&mut sorted, chunk, &mut scratch);
            let mut popped = Vec::new();
            loop {
                if sorted.len() == unsorted && unsorted > 0 {
                    chunk *= 2;
                    unsorted = sort_largest(&mut sorted, chunk, &mut scratch);
                }
                let Some(key) = sorted.pop() else { break };
                popped.push(key);
            }
            prop_assert_eq!(popped, expected);
        }

        /// The ranked radix sort puts a filling's keys in the order a comparison sort does,
        /// whether their shares are few (ranked), many (sorted as they are), large link ids or
        /// small (one to four bytes of them differing), and with keys left from an earlier
        /// sort in its scratch.
        #[test]
        fn sort_order_keys_sorts_as_sort_unstable(
            shares in prop::collection::vec(0.0f64..1e12, 1..24),
            links in prop_oneof![
                prop::collection::btree_set(0u32..400, 0..300),
                prop::collection::btree_set(0u32..70_000, 0..300),
                prop::collection::btree_set(0u32..20_000_000, 0..300),
                prop::collection::btree_set(any::<u32>(), 0..300),
            ],
            picks in prop::collection::vec(any::<usize>(), 300),
        ) {
            let keys: Vec<u128> = links
                .iter()
                .zip(&picks)
                .map(|(&link, &pick)| order_key(shares[pick % shares.len()], link))
                .collect();
            let mut expected = keys.clone();
            expected.sort_unstable();
            let mut scratch = KeySort::default();
            let mut sorted = keys.iter().rev().copied().collect::<Vec<_>>();
            sort_order_keys(&mut sorted, &mut scratch);
            prop_assert_eq!(&sorted, &expected);
            let mut again = keys;
            sort_order_keys(&mut again, &mut scratch);
            prop_assert_eq!(again, expected);
        }
    }
}
