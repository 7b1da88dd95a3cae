//! A model of the fence and its expiry on every node, for the argument of the crate docs'
//! `# Per-key state`: a key whose fence expired still gets a greater token. The mint is
//! [`mint`], the Rust mirror of the scripts' (`crate::redlock` checks its Lua against it on a
//! real server); the rest is how Redis expires a key and how a Redlock lease picks and raises
//! its token. Property tests run it over windows at and just above the smallest one each store
//! accepts, and a fixed history shows a Redlock window just below it handing a token out twice.

use std::time::Duration;

use proptest::prelude::*;

use crate::redlock::{min_retention, TOKEN_GRANULE};

/// The Rust mirror of a mint: `max(fence + 1, now rounded down to granule)`, the fence `None`
/// when missing or expired. Redlock's granule is [`TOKEN_GRANULE`] (`mint_lua!` in
/// `redlock::scripts`), one server's 1 µs (`mint_lua!` in `script`: no rounding).
pub(crate) fn mint(fence: Option<u64>, now_micros: u64, granule_micros: u64) -> u64 {
    let floor = now_micros - now_micros % granule_micros;
    match fence {
        Some(fence) if fence >= floor => fence + 1,
        _ => floor,
    }
}

/// One node: its clock's lead over real time (µs) and its fence, with the fence's expiry in
/// the node's ms as Redis keeps it.
#[derive(Debug, Clone, Copy)]
struct Node {
    lead: u64,
    fence: Option<(u64, u64)>,
}

impl Node {
    fn clock(&self, real: u64) -> u64 {
        real + self.lead
    }

    /// The fence a script starting at `real` sees: Redis deems a key expired once its ms clock
    /// is past the expiry (`now > when`).
    fn live_fence(&self, real: u64) -> Option<u64> {
        let now_ms = self.clock(real) / 1_000;
        self.fence
            .filter(|&(_, expires_ms)| now_ms <= expires_ms)
            .map(|(value, _)| value)
    }

    /// `SET fence value PX retention` by a script that started at `real`: `PX` counts from the
    /// script's start, in ms.
    fn write(&mut self, real: u64, value: u64, retention_ms: u64) {
        self.fence = Some((value, self.clock(real) / 1_000 + retention_ms));
    }

    /// The acquire script started at `real`, reading `TIME` `run` µs later.
    fn acquire(&mut self, real: u64, run: u64, granule: u64, retention_ms: u64) -> u64 {
        let token = mint(self.live_fence(real), self.clock(real + run), granule);
        self.write(real, token, retention_ms);
        token
    }

    /// The raise script (`RAISE_LUA`): the fence goes up to `token` if below, and expires one
    /// window later either way.
    fn raise(&mut self, real: u64, token: u64, retention_ms: u64) {
        let fence = self.live_fence(real).unwrap_or(0);
        self.write(real, fence.max(token), retention_ms);
    }
}

/// One acquire attempt: which nodes grant (a minority grants nothing usable, but its mints
/// still write fences), each node's delay before its script starts and the script's run before
/// its `TIME`, and when the next attempt starts, as µs from one retention window after this one.
#[derive(Debug, Clone)]
struct Attempt {
    granting: Vec<bool>,
    delays: Vec<u64>,
    runs: Vec<u64>,
    after_window: i64,
}

/// The tokens of the leases handed out by `attempts`, one after another, on nodes whose clocks
/// lead real time by `leads`: each granting node mints, the lease takes the largest token, and
/// when fewer than a quorum minted that one, the granting nodes below it are raised to it
/// (after every mint answered), as `redlock::store` does. One node and a granule of 1 µs is
/// one server.
fn tokens_handed_out(
    leads: &[u64],
    granule: u64,
    retention: Duration,
    start: u64,
    attempts: &[Attempt],
) -> Vec<u64> {
    let retention_ms = u64::try_from(retention.as_millis()).expect("a window in ms");
    let quorum = leads.len() / 2 + 1;
    let mut nodes: Vec<Node> = leads
        .iter()
        .map(|&lead| Node { lead, fence: None })
        .collect();
    let mut real = start;
    let mut tokens = Vec::new();
    for attempt in attempts {
        let minted: Vec<Option<u64>> = nodes
            .iter_mut()
            .enumerate()
            .map(|(i, node)| {
                attempt.granting[i].then(|| {
                    node.acquire(
                        real + attempt.delays[i],
                        attempt.runs[i],
                        granule,
                        retention_ms,
                    )
                })
            })
            .collect();
        let answered = real + attempt.delays.iter().max().copied().unwrap_or(0) + 1;
        let granted: Vec<u64> = minted.iter().flatten().copied().collect();
        if granted.len() >= quorum {
            let token = granted.iter().copied().max().unwrap_or(0);
            let witnesses = granted.iter().filter(|&&t| t == token).count();
            if witnesses < quorum {
                for (node, mint) in nodes.iter_mut().zip(&minted) {
                    if mint.is_some_and(|m| m < token) {
                        node.raise(answered, token, retention_ms);
                    }
                }
            }
            tokens.push(token);
        }
        let next = real as i64 + (retention_ms * 1_000) as i64 + attempt.after_window;
        real = u64::try_from(next).unwrap_or(0).max(answered + 1);
    }
    tokens
}

/// The first pair of consecutive tokens that does not grow, if any.
fn first_repeat(tokens: &[u64]) -> Option<(u64, u64)> {
    tokens
        .windows(2)
        .find(|pair| pair[1] <= pair[0])
        .map(|pair| (pair[0], pair[1]))
}

const GRANULE_MICROS: u64 = TOKEN_GRANULE.as_micros() as u64;

fn attempts(nodes: usize, past_window: i64) -> impl Strategy<Value = Vec<Attempt>> {
    let attempt = (
        proptest::collection::vec(any::<bool>(), nodes),
        proptest::collection::vec(0..2_000u64, nodes),
        proptest::collection::vec(0..100u64, nodes),
        // Half the attempts start around the moment the fences expire, where a repeat hides.
        prop_oneof![-300_000..=past_window, -2_000..=2_000i64],
    )
        .prop_map(|(granting, delays, runs, after_window)| Attempt {
            granting,
            delays,
            runs,
            after_window,
        });
    proptest::collection::vec(attempt, 1..16)
}

/// A start time in µs, about 2024: anywhere, or (half the time) within `near` µs before the
/// start of a Redlock granule, where a clock that leads by the skew just entered the next one.
fn start(near: u64) -> impl Strategy<Value = u64> {
    let granules = 1_700_000_000_000_000 / GRANULE_MICROS..1_800_000_000_000_000 / GRANULE_MICROS;
    prop_oneof![
        1_700_000_000_000_000..1_800_000_000_000_000u64,
        (granules, 0..=near).prop_map(|(k, before)| k * GRANULE_MICROS - before),
    ]
}

/// The lead of each of `nodes` clocks, up to `skew` µs: anywhere, or at either end.
fn leads(nodes: usize, skew: u64) -> impl Strategy<Value = Vec<u64>> {
    let lead = prop_oneof![0..=skew, Just(0), Just(skew)];
    proptest::collection::vec(lead, nodes)
}

proptest! {
    // A run takes well under a second; a failure is not saved (`failure_persistence`): the
    // printed case is enough to turn into a fixed history like the one below.
    #![proptest_config(ProptestConfig {
        cases: 2_048,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Redlock, 3 nodes whose clocks differ by up to `max_skew`, a window at the smallest
    /// `redlock://` accepts or up to 2 ms above it: every lease's token is greater than the
    /// one before, whether the fences expired in between or not.
    #[test]
    fn redlock_tokens_grow_across_expired_fences_at_the_smallest_window(
        (skew_ms, leads, extra_ms, attempts, start) in (0..=300u64).prop_flat_map(|skew_ms| (
            Just(skew_ms),
            leads(3, skew_ms * 1_000),
            0..=2u64,
            attempts(3, (GRANULE_MICROS + skew_ms * 1_000 + 2_000) as i64),
            start(skew_ms * 1_000 + 5_000),
        )),
    ) {
        let retention = min_retention(Duration::from_millis(skew_ms))
            + Duration::from_millis(extra_ms);
        let tokens = tokens_handed_out(&leads, GRANULE_MICROS, retention, start, &attempts);
        prop_assert_eq!(first_repeat(&tokens), None, "tokens {:?}", tokens);
    }

    /// One server (`redis://`, a Cluster's slot master): no granule and no skew, so the
    /// smallest window the URL accepts at all (above a `max_ttl` of 1 ms) keeps tokens growing.
    #[test]
    fn one_server_tokens_grow_across_expired_fences_at_any_accepted_window(
        window_ms in 2..=4u64,
        attempts in attempts(1, 2_000),
        start in start(5_000),
    ) {
        let retention = Duration::from_millis(window_ms);
        let tokens = tokens_handed_out(&[0], 1, retention, start, &attempts);
        prop_assert_eq!(first_repeat(&tokens), None, "tokens {:?}", tokens);
    }
}

/// The bound is tight: with a window 3 ms below it, a node whose clock leads by the whole skew
/// mints a granule's first µs, a node behind is raised to it, and a lease one window later
/// on that node and a third one mints the same floor again.
#[test]
fn a_redlock_window_just_below_the_bound_repeats_a_token() {
    let skew = Duration::from_millis(50);
    let lead = skew.as_micros() as u64;
    // Node 0 leads by the skew; its clock is at the start of a granule when A begins.
    let start = 6_500_000 * GRANULE_MICROS - lead;
    let history = |retention: Duration| {
        let retention_ms = retention.as_millis() as u64;
        // B starts at the first ms node 1 deems A's raise expired.
        let after_window = ((start / 1_000 + retention_ms + 1) * 1_000) as i64
            - (start + retention_ms * 1_000) as i64;
        let a = Attempt {
            granting: vec![true, true, false],
            delays: vec![0; 3],
            runs: vec![0; 3],
            after_window,
        };
        let b = Attempt {
            granting: vec![false, true, true],
            ..a.clone()
        };
        tokens_handed_out(&[lead, 0, 0], GRANULE_MICROS, retention, start, &[a, b])
    };
    let bound = min_retention(skew);
    let below = history(bound - Duration::from_millis(3));
    assert_eq!(below.len(), 2);
    assert_eq!(
        first_repeat(&below),
        Some((below[0], below[0])),
        "a window below the bound hands the same token out twice: {below:?}"
    );
    let at = history(bound);
    assert_eq!(first_repeat(&at), None, "{at:?}");
}

#[test]
fn the_mint_floors_at_the_granule_and_steps_past_the_fence() {
    let g = GRANULE_MICROS;
    assert_eq!(mint(None, 5 * g + 7, g), 5 * g);
    assert_eq!(mint(Some(5 * g - 1), 5 * g + 7, g), 5 * g);
    assert_eq!(mint(Some(5 * g), 5 * g + 7, g), 5 * g + 1);
    assert_eq!(mint(Some(9 * g), 5 * g + 7, g), 9 * g + 1);
    assert_eq!(mint(None, 5 * g + 7, 1), 5 * g + 7);
}
